"""The house keeps its shape: docs/ARCHITECTURE.md's layers, read from the package's own code
(its .py files, and the cimport and import lines of its compiled modules under pyx/).

Each module imports only its own layer and the layers below it, and none of the layers
the sideways rules keep apart; no module imports another module's private names, nor
reaches private attributes of another module's objects; an import inside a function says
why (a comment on its line or above it in the same function: an optional dependency, a
cycle, start-up cost).
"""
from __future__ import annotations

import ast
import pathlib
import re

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "embedlog"

# bottom to top (docs/ARCHITECTURE.md, "Layers"); a module belongs to the longest prefix that names it
LAYERS = [
    ("shared", ["embedlog", "embedlog.errors", "embedlog.config", "embedlog.failpoints",
                "embedlog.fileio", "embedlog.meta.api", "embedlog._native", "embedlog._types",
                "embedlog.forking", "embedlog.proc"]),
    ("bookie", ["embedlog.bookie"]),
    ("meta", ["embedlog.meta"]),
    # the compiled modules sit in one package (pyx/embedlog/_native), each in its layer: the
    # ADD frame and the server's frame buffers are the wire's, the add path the client's
    ("net", ["embedlog.net", "embedlog._native.frames"]),
    ("client", ["embedlog.client", "embedlog._native.addpath"]),
    ("harness", ["embedlog.harness", "embedlog.embedded", "embedlog.aio"]),
    ("admin", ["embedlog.admin"]),
    ("cli", ["embedlog.cli", "embedlog.pytest_plugin"]),
    ("spark", ["embedlog.spark"]),
]
RANK = {name: i for i, (name, _) in enumerate(LAYERS)}
# pairs of packages the ranks would let import each other, and why they must not
# (docs/ARCHITECTURE.md, "What each layer may import")
SIDEWAYS = [
    ("embedlog.client", "embedlog.bookie", "the client reaches bookies over the wire (net), "
                                           "never their storage"),
    ("embedlog.meta", "embedlog.bookie", "the bookie is handed a store; a driver never uses it"),
    ("embedlog.meta", "embedlog.client", "the drivers serve the client; they never use it"),
    ("embedlog.spark", "embedlog.harness", "a Spark job reads and writes a cluster; it never "
                                           "runs one"),
]
# private attributes (file, attribute) a module still reaches on another module's objects,
# and why they stay
REACH_INS = {
    ("embedlog/forking.py", "_after_fork"):
        "the hook every object forking.track() holds defines, private so that no user calls it",
    ("embedlog/client/stream.py", "_local"):
        "ClientContext's in-process bookies (an embedded log's streams): a public name belongs "
        "with the next change of client/context.py",
}


def layer_of(module: str) -> str | None:
    best = None
    for name, prefixes in LAYERS:
        for p in prefixes:
            # the package's own __init__ ("embedlog") is the facade, not a prefix of all
            if (module == p or p != "embedlog" and module.startswith(p + ".")) and (best is None or len(p) > len(best[1])):
                best = (name, p)
    return best[0] if best else None


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_module(dotted: str) -> bool:
    """``dotted`` names a module or package of embedlog (not a function or class)."""
    if not dotted.startswith("embedlog"):
        return False
    base = PACKAGE.parent / dotted.replace(".", "/")
    return base.is_dir() or base.with_suffix(".py").exists() or any(base.parent.glob(base.name + ".*.so"))


def modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield module_name(path), path, ast.parse(path.read_text(), str(path))


def imports(tree: ast.AST, module: str):
    """(line, imported module, imported names, inside a function?) of every import."""
    package = module if module.count(".") == 0 else module.rsplit(".", 1)[0]
    found = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.Import):
                for a in child.names:
                    found.append((child, a.name, [], in_function))
            elif isinstance(child, ast.ImportFrom):
                target = child.module or ""
                if child.level:  # relative: resolve against this module's package
                    base = package.split(".")[: len(package.split(".")) - child.level + 1]
                    target = ".".join(base + ([target] if target else []))
                found.append((child, target, [a.name for a in child.names], in_function))
            visit(child, inner)

    visit(tree, False)
    return found


def type_checking_lines(tree: ast.AST) -> set:
    """Lines under ``if TYPE_CHECKING:``: imports for type checkers, never run."""
    return {n.lineno for node in ast.walk(tree)
            if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING"
            for stmt in node.body for n in ast.walk(stmt) if hasattr(n, "lineno")}


# ---- the compiled modules: pyx/ mirrors the package path (pyx/embedlog/_native/x.pyx is
# embedlog._native.x); Cython's cimport and import lines read as text, strings and comments out
PYX = PACKAGE.parent / "pyx"
_STRINGS = re.compile(r'("""|\'\'\')(?:.|\n)*?\1')
_PYX_IMPORT = re.compile(r"^[ \t]*(?:from[ \t]+([\w.]+)[ \t]+c?import[ \t]*(\([^)]*\)|[^\n]*)"
                         r"|c?import[ \t]+([\w.][\w., \t]*))", re.M)


def pyx_modules():
    for path in sorted(PYX.rglob("*.pyx")) + sorted(PYX.rglob("*.pxd")):
        parts = list(path.relative_to(PYX).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        yield ".".join(parts), path


def pyx_imports(path: pathlib.Path):
    """(line, imported module, imported names) of every cimport and import in a .pyx/.pxd."""
    text = _STRINGS.sub(lambda m: "\n" * m.group(0).count("\n"), path.read_text())
    text = re.sub(r"#[^\n]*", "", text)
    found = []
    for m in _PYX_IMPORT.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        if m.group(1):
            names = [n.split(" as ")[0].strip() for n in m.group(2).strip("()").split(",")]
            found.append((line, m.group(1), [n for n in names if n]))
        else:
            for n in m.group(3).split(","):
                if n.strip():
                    found.append((line, n.split(" as ")[0].strip(), []))
    return found


def test_compiled_modules_are_read_too():
    """The reader finds what a compiled module imports: the layer rules below would pass
    on a reader that found nothing."""
    addpath = PYX / "embedlog" / "_native" / "addpath.pyx"
    got = {(t, tuple(n)) for _, t, n in pyx_imports(addpath)}
    assert ("embedlog.errors", ("EmbedlogError", "IllegalOpError")) in got
    assert any(t == "embedlog._native.format" and "encode_into" in n for t, n in got)
    assert ("threading", ()) in got
    scan = {t for _, t, _ in pyx_imports(PYX / "embedlog" / "_native" / "journal_scan.pyx")}
    assert "corruption" not in scan          # its docstring's "from corruption in ..." is text
    assert all(layer_of(m) is not None for m, _ in pyx_modules())


def test_compiled_modules_import_only_their_layer_and_below():
    """The layer, sideways and private-module rules, for the .pyx and .pxd files."""
    found = []
    for module, path in pyx_modules():
        mine = RANK[layer_of(module)]
        where = path.relative_to(PYX.parent)
        for line, target, names in pyx_imports(path):
            if not target.startswith("embedlog"):
                continue
            for t in sorted(_targets(target, names)):
                theirs = layer_of(t)
                if theirs is not None and RANK[theirs] > mine:
                    found.append(f"{where}:{line} ({layer_of(module)}) imports {t} ({theirs})")
                for low, high, why in SIDEWAYS:
                    if _within(module, low) and _within(t, high):
                        found.append(f"{where}:{line} imports {t}: {why}")
            owner = _private_module(target)
            if owner is not None and not (module + ".").startswith(owner + "."):
                found.append(f"{where}:{line} imports the private module {target}")
            found += [f"{where}:{line} imports {target}.{n}" for n in names if _private(n)]
    assert not found, "compiled modules breaking the layer rules:\n" + "\n".join(found)


def test_the_table_names_every_module():
    unplaced = [m for m, _, _ in modules() if layer_of(m) is None]
    assert not unplaced, f"modules outside docs/ARCHITECTURE.md's layers (add them to LAYERS): {unplaced}"


def test_no_module_imports_a_layer_above_it():
    upward = []
    for module, path, tree in modules():
        if layer_of(module) is None:
            continue  # test_the_table_names_every_module reports it
        mine = RANK[layer_of(module)]
        checking = type_checking_lines(tree)
        for node, target, names, in_function in imports(tree, module):
            if not target.startswith("embedlog"):
                continue
            # `from embedlog.x import y` may name a submodule y
            targets = {f"{target}.{n}" if is_module(f"{target}.{n}") else target for n in names} or {target}
            for t in sorted(targets):
                theirs = layer_of(t)
                # the facade loads its layers on first use; its annotations name them
                lazy = in_function or node.lineno in checking
                if theirs is not None and RANK[theirs] > mine and not (module == "embedlog" and lazy):
                    upward.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} "
                                  f"({layer_of(module)}) imports {t} ({theirs})")
    assert not upward, "imports up a layer:\n" + "\n".join(upward)


def _private(name: str) -> bool:
    # _native is the package of compiled modules, public to the whole house
    return name.startswith("_") and not name.startswith("__") and name != "_native"


def _private_module(target: str) -> str | None:
    """The package a private module (``x._y``) belongs to, or None if ``target`` is public."""
    parts = target.split(".")
    for i, p in enumerate(parts):
        if _private(p):
            return ".".join(parts[:i])
    return None


def test_no_module_imports_another_modules_private_names():
    found = []
    for module, path, tree in modules():
        aliases = {}
        for node, target, names, _ in imports(tree, module):
            if not target.startswith("embedlog") or target == module:
                continue
            where = f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
            owner = _private_module(target)
            if owner is not None and not (module + ".").startswith(owner + "."):
                found.append(f"{where} imports the private module {target}")
            for n in names:
                if _private(n):
                    found.append(f"{where} imports {target}.{n}")
            if isinstance(node, ast.ImportFrom):
                for a in node.names:
                    aliases[a.asname or a.name] = f"{target}.{a.name}"
            else:
                for a in node.names:
                    aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and is_module(aliases.get(node.value.id, "")) and _private(node.attr)):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} uses "
                             f"{aliases[node.value.id]}.{node.attr}")
    assert not found, "private names used across modules:\n" + "\n".join(found)


def _targets(target: str, names: list) -> set:
    """What an import names: ``from embedlog.x import y`` may name a submodule y."""
    return {f"{target}.{n}" if is_module(f"{target}.{n}") else target for n in names} or {target}


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_no_module_imports_sideways():
    found = []
    for module, path, tree in modules():
        checking = type_checking_lines(tree)
        for node, target, names, _ in imports(tree, module):
            if not target.startswith("embedlog") or node.lineno in checking:
                continue
            for t in sorted(_targets(target, names)):
                for low, high, why in SIDEWAYS:
                    if _within(module, low) and _within(t, high):
                        found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} "
                                     f"imports {t}: {why}")
    assert not found, "imports the sideways rules forbid:\n" + "\n".join(found)


def _own_names(tree: ast.AST) -> set:
    """Names a module defines: its functions and classes, names it assigns, parameters,
    __slots__, and attributes it sets on self or cls. A private attribute named nowhere
    here belongs to another module's object."""
    names = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(n.name)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            names.add(n.id)
        elif isinstance(n, ast.arg):
            names.add(n.arg)
        elif (isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
              and isinstance(n.value, ast.Name) and n.value.id in ("self", "cls")):
            names.add(n.attr)
        elif isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "__slots__" for t in n.targets):
            names.update(c.value for c in ast.walk(n.value)
                         if isinstance(c, ast.Constant) and isinstance(c.value, str))
    return names


def test_no_module_reaches_private_attributes_of_another_modules_objects():
    found, allowed = [], set()
    for module, path, tree in modules():
        where = str(path.relative_to(PACKAGE.parent))
        own = _own_names(tree)
        # names bound to modules: their private names are the test above's
        modules_here = set()
        for node, target, names, _ in imports(tree, module):
            if isinstance(node, ast.Import):
                modules_here.update(a.asname or a.name.split(".")[0] for a in node.names)
            else:
                modules_here.update(a.asname or a.name for a in node.names
                                    if is_module(f"{target}.{a.name}"))
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and _private(node.attr)) or node.attr in own:
                continue
            if isinstance(node.value, ast.Name) and (node.value.id in ("self", "cls") or
                                                     node.value.id in modules_here):
                continue
            key = (where, node.attr)
            if key in REACH_INS:
                allowed.add(key)
            else:
                found.append(f"{where}:{node.lineno} reaches {ast.unparse(node)}")
    assert not found, ("private attributes of another module's objects (give them a public "
                       "name, or say why in REACH_INS):\n" + "\n".join(found))
    stale = sorted(set(REACH_INS) - allowed)
    assert not stale, f"REACH_INS entries that no longer match (remove them): {stale}"


def test_an_import_inside_a_function_says_why():
    silent = []
    for module, path, tree in modules():
        lines = path.read_text().splitlines()
        functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for node, target, _, in_function in imports(tree, module):
            if not in_function:
                continue
            start = max(f.lineno for f in functions if f.lineno <= node.lineno <= f.end_lineno)
            said = any("#" in lines[i - 1] for i in range(start, node.lineno + 1))
            if not said:
                silent.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} import {target}")
    assert not silent, ("imports inside functions with no comment saying why (move them to the "
                        "top, or say: optional dependency, cycle, start-up cost):\n" + "\n".join(silent))


@pytest.mark.parametrize("module,layer", [
    ("embedlog.errors", "shared"), ("embedlog.meta.api", "shared"), ("embedlog.meta.sqlite", "meta"),
    ("embedlog.bookie.journal", "bookie"), ("embedlog.client.write", "client"),
    ("embedlog.embedded", "harness"), ("embedlog.spark.source", "spark"), ("embedlog", "shared"),
    ("embedlog._native.format", "shared"), ("embedlog._native.frames", "net"),
    ("embedlog._native.addpath", "client"),
])
def test_layer_table(module, layer):
    assert layer_of(module) == layer
