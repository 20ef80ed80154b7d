"""The fuzz targets of tools/fuzz in the default run: every seed and every regression input
replayed through its target, a structure-aware hypothesis test per target (valid records
from embedlog's encoders, mutated: bytes flipped, cut, extended, length fields changed,
checksums fixed up so the mutation reaches the parser behind them), and a brief atheris run
of each target (tools/fuzz.py). A target raises only for a crash: anything but an
EmbedlogError, or a broken invariant."""
import glob
import json
import math
import os
import struct
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.cliutil import ROOT
from embedlog._native import format as F
from embedlog._native import journal_format as jformat
from embedlog.net import protocol as P

FUZZ = os.path.join(ROOT, "tools", "fuzz")
sys.path.insert(0, FUZZ)
import targets  # noqa: E402

TARGETS = sorted(targets.TARGETS)
# EMBEDLOG_FUZZ_EXAMPLES=5000 for a longer hunt (random, not the CI's fixed examples)
EXAMPLES = int(os.environ.get("EMBEDLOG_FUZZ_EXAMPLES", "0"))
FAST = settings(max_examples=EXAMPLES or 60, deadline=None, derandomize=not EXAMPLES,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _inputs(kind, target):
    return sorted(glob.glob(os.path.join(FUZZ, kind, target, "*")))


def _seeds(target):
    return [open(p, "rb").read() for p in _inputs("corpus", target)]


# -- replay -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("target", TARGETS)
def test_corpus_and_regressions_replay(target):
    seeds = _inputs("corpus", target)
    assert seeds, f"no seed corpus for {target}: run tools/fuzz/make_corpus.py"
    for path in seeds + _inputs("regressions", target):
        try:
            targets.TARGETS[target](open(path, "rb").read())
        except BaseException as exc:
            raise AssertionError(f"{os.path.relpath(path, ROOT)} crashes {target}: {exc!r}") from exc


def test_regressions_have_targets():
    for d in glob.glob(os.path.join(FUZZ, "regressions", "*")):
        assert os.path.basename(d) in targets.TARGETS, d


# -- mutations ----------------------------------------------------------------------------------------

INTERESTING = [0, 1, 2, 7, 0x7F, 0x80, 0xFF, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF,
               1 << 32, (1 << 63) - 1, 1 << 63, (1 << 64) - 1]


@st.composite
def mutate(draw, base: bytes, fields=()):
    """``base`` changed a few times: bit flips, cuts, extensions, splices, and u8/u32/u64
    writes of interesting values, often at ``fields`` (the offsets of its length and id
    fields) rather than anywhere."""
    data = bytearray(base)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "cut", "extend", "field", "field", "dup"]))
        if op == "flip" and data:
            i = draw(st.integers(0, len(data) - 1))
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "cut" and data:
            del data[draw(st.integers(0, len(data) - 1)):]
        elif op == "extend":
            data += draw(st.binary(max_size=64))
        elif op == "dup" and data:
            i = draw(st.integers(0, len(data) - 1))
            data[i:i] = data[i:i + draw(st.integers(1, 64))]
        elif op == "field":
            size = draw(st.sampled_from([1, 4, 8]))
            pos = draw(st.sampled_from(list(fields))) if fields and draw(st.booleans()) else \
                draw(st.integers(0, max(0, len(data) - size)))
            value = draw(st.sampled_from(INTERESTING + [len(data), len(data) - pos, pos]) |
                         st.integers(0, (1 << 64) - 1))
            chunk = (value % (1 << (8 * size))).to_bytes(size, "big")
            if pos + size <= len(data):
                data[pos:pos + size] = chunk
    return bytes(data)


def _records(data: bytes, start: int) -> list:
    """Offsets of the length-prefixed records (u32 length) from ``start``, while they fit."""
    out, pos = [], start
    while pos + 4 <= len(data):
        (n,) = struct.unpack_from(">I", data, pos)
        out.append(pos)
        if n == 0 or n == 0xFFFFFFFF or pos + 4 + n > len(data):
            break
        pos += 4 + n + (5 if start == jformat.HEADER_SIZE else 0)      # journal: crc and type
    return out


def _fix_journal(data: bytes) -> bytes:
    """Good header and record checksums again, so the scan looks past them."""
    b = bytearray(data)
    if len(b) >= 20:
        b[16:20] = struct.pack(">I", F.crc32c(bytes(b[:16])))
    pos = jformat.HEADER_SIZE
    while pos + 9 <= len(b):
        (n,) = struct.unpack_from(">I", b, pos)
        if n == 0 or pos + 9 + n > len(b):
            break
        b[pos + 4:pos + 8] = struct.pack(">I", F.crc32c(bytes(b[pos + 8:pos + 9 + n]),
                                                        F.crc32c(bytes(b[pos:pos + 4]))))
        pos += 9 + n
    return bytes(b)


def _fix_index(data: bytes) -> bytes:
    if len(data) < 1024:
        return data
    return data[:1020] + struct.pack(">I", F.crc32c(data[:1020])) + data[1024:]


def _fix_map(data: bytes) -> bytes:
    """The ledgers map's checksum again, where the header points at a map that fits."""
    if len(data) < 1024:
        return data
    off, count = struct.unpack_from(">QI", data, 8)
    end = off + 8 + 24 * count
    if not 1024 <= off or end + 4 > len(data):
        return data
    return data[:end] + struct.pack(">I", F.crc32c(data[off:end])) + data[end + 4:]


def _check(target, data):
    targets.TARGETS[target](data)


# -- one hypothesis test per target -------------------------------------------------------------

DIGESTS = ["crc32", "mac", "crc32c", "dummy"]
u64 = st.integers(0, (1 << 64) - 1)
i64 = st.integers(-(1 << 63), (1 << 63) - 1)


@st.composite
def entries(draw):
    scope = draw(st.sampled_from([0, 0, 7]) | u64)
    lid = draw(st.integers(0, (1 << 63) - 1)) if scope == 0 else draw(u64)
    digest = draw(st.sampled_from(DIGESTS))
    e = F.encode_entry(scope, lid, draw(st.integers(0, (1 << 63) - 1)), draw(i64), draw(i64),
                       digest, draw(st.binary(max_size=40)), F.mac_key(targets.MAC_PASSWORD))
    return bytes([DIGESTS.index(digest) | 8 * draw(st.booleans())]) + e


@FAST
@given(st.data())
def test_entry(data):
    base = data.draw(entries())
    fields = [1, 2, 9, 17, 25, 33, 41] if base[1] & 0x80 else [1, 9, 17, 25, 33]
    _check("entry", data.draw(mutate(base, fields)))


@FAST
@given(st.data())
def test_journal(data):
    base = data.draw(st.sampled_from(_seeds("journal")))
    fields = [4, 8] + _records(base, jformat.HEADER_SIZE) + [p + 8 for p in _records(base, jformat.HEADER_SIZE)]
    m = data.draw(mutate(base, fields))
    _check("journal", _fix_journal(m) if data.draw(st.booleans()) else m)


@FAST
@given(st.data())
def test_entrylog(data):
    base = data.draw(st.sampled_from(_seeds("entrylog")))
    (map_off,) = struct.unpack_from(">Q", base, 8)
    fields = [8, 12, 16, 20, 24] + _records(base, 1024) + ([map_off, map_off + 4] if map_off else [])
    m = data.draw(mutate(base, fields))
    _check("entrylog", _fix_map(m) if data.draw(st.booleans()) else m)


@FAST
@given(st.data())
def test_index(data):
    base = data.draw(st.sampled_from(_seeds("index")))
    m = data.draw(mutate(base, [4, 8, 12, 80, 88, 1024, 1032, 1024 + 8 * 1023]))
    _check("index", _fix_index(m) if data.draw(st.booleans()) else m)


@st.composite
def requests(draw):
    key, rid, scope, lid = draw(st.binary(min_size=20, max_size=20)), draw(u64), draw(u64), draw(u64)
    es = [F.encode_entry(7, 3, i, i - 1, i, "crc32c", draw(st.binary(max_size=16)))
          for i in range(draw(st.integers(0, 3)))]
    return draw(st.sampled_from([
        P.add_request(rid, scope, lid, key, es, flags=draw(st.integers(0, 0xFFFF))),
        P.read_request(rid, scope, lid, draw(i64), draw(st.integers(0, 0xFFFFFFFF))),
        P.read_lac_request(rid, scope, lid), P.write_lac_request(rid, scope, lid, key, draw(i64)),
        P.trim_request(rid, scope, lid, key, draw(i64)), P.bookie_info_request(rid),
        P.auth_request(rid, draw(st.binary(max_size=32)))]))


@FAST
@given(st.data())
def test_wire_request(data):
    base = data.draw(requests()) + data.draw(requests())
    n = struct.unpack_from(">I", base)[0]
    _check("wire_request", data.draw(mutate(base, [0, 4, 5, 6, 68, 72, 4 + n, 8 + n])))


@st.composite
def responses(draw):
    op, rid, status = draw(st.sampled_from(sorted(P.OPS))), draw(u64), draw(st.sampled_from([0, 0, 1, 101]))
    es = [(draw(i64), draw(st.binary(max_size=16))) for _ in range(draw(st.integers(0, 3)))]
    body = draw(st.sampled_from([P.read_response_body(draw(i64), es),
                                 P.READ_LAC_RESP.pack(draw(i64), draw(i64), 3) + b"abc",
                                 P.ADD_RESP.pack(draw(i64), 1), b""]))
    if status:
        return P.error_response(op, 0, rid, status, 7, 3, draw(st.text(max_size=20)))
    return P.response(op, 0, rid, status, 7, 3, body)


@FAST
@given(st.data())
def test_wire_response(data):
    base = data.draw(responses()) + data.draw(responses())
    _check("wire_response", data.draw(mutate(base, [0, 4, 5, 16, 36, 44, 48, 56])))


# JSON values as a hostile store or checkpoint may hold them: every type, odd numbers, deep nests
json_scalars = (st.none() | st.booleans() | st.integers(-(1 << 70), 1 << 70)
                | st.floats(allow_nan=True) | st.text(max_size=8))
json_values = st.recursive(json_scalars, lambda c: st.lists(c, max_size=3)
                           | st.dictionaries(st.text(max_size=6), c, max_size=3), max_leaves=8)
deep = st.integers(1, 3000).map(lambda n: "[" * n + "]" * n)


@st.composite
def json_edit(draw, text: str) -> str:
    """A JSON document with one member (at any depth) replaced by another value, a deep
    nest, or dropped."""
    doc = json.loads(text)
    if not isinstance(doc, dict) or not doc:
        return draw(deep) if draw(st.booleans()) else json.dumps(draw(json_values))
    node = doc
    while True:
        key = draw(st.sampled_from(sorted(node)))
        child = node[key]
        if isinstance(child, dict) and child and draw(st.booleans()):
            node = child
            continue
        break
    if draw(st.integers(0, 5)) == 0:
        del node[key]
        return json.dumps(doc)
    marker = "\x00deep\x00"
    node[key] = marker if draw(st.integers(0, 4)) == 0 else draw(json_values)
    return json.dumps(doc).replace(json.dumps(marker), draw(deep))


@FAST
@given(st.data())
def test_metadata(data):
    seed = data.draw(st.sampled_from(_seeds("metadata")))
    kind, value = seed[:1], seed[1:]
    head, sep, body = value.partition(b"\n") if value.startswith(b"embedlog-") else (b"", b"", value)
    try:
        body = data.draw(json_edit(body.decode())).encode()
    except ValueError:                      # a layout record: key=value lines, not JSON
        pass
    m = kind + head + sep + body
    _check("metadata", data.draw(mutate(m, [1])) if data.draw(st.integers(0, 3)) == 0 else m)


@FAST
@given(st.data())
def test_spark_offset(data):
    offsets = st.dictionaries(st.text(max_size=8), json_values | st.integers(-2, 1 << 64), max_size=4)
    text = data.draw(st.sampled_from(["earliest", "latest", "EARLIEST", " latest "])
                     | offsets.map(json.dumps) | deep | json_values.map(json.dumps))
    _check("spark_offset", text.encode("utf-8", "surrogatepass"))


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, list):
        return "[" + ", ".join(map(_toml_value, v)) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"
    return json.dumps(v)


toml_values = st.recursive(
    st.booleans() | st.integers(-(1 << 64), 1 << 64) | st.floats() | st.text(max_size=8),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c, max_size=2),
    max_leaves=6)


@FAST
@given(st.data())
def test_config_toml(data):
    from embedlog.config import BookieConfig
    keys = st.sampled_from(sorted(BookieConfig.keys())) | st.text(max_size=8)
    pairs = data.draw(st.lists(st.tuples(keys, toml_values | deep), max_size=4))
    text = "".join(f"{json.dumps(k)} = {v if isinstance(v, str) and v.startswith('[') else _toml_value(v)}\n"
                   for k, v in pairs)
    raw = text.encode("utf-8", "surrogatepass")
    _check("config_toml", data.draw(mutate(raw)) if data.draw(st.integers(0, 3)) == 0 else raw)


@FAST
@given(st.data())
def test_config_env(data):
    from embedlog.config import BookieConfig
    keys = st.sampled_from(sorted(BookieConfig.keys())) | st.text(max_size=8)
    values = (st.sampled_from(["nan", "inf", "-0", "1_000", "0x10", "true", "on", " 5 ", ""])
              | st.integers(-(1 << 70), 1 << 70).map(str) | st.floats().map(repr) | st.text(max_size=12))
    lines = data.draw(st.lists(st.tuples(keys, values), max_size=5))
    _check("config_env", "".join(f"{k}={v}\n" for k, v in lines).encode("utf-8", "surrogatepass"))


@st.composite
def kernel_inputs(draw):
    """add_kernels' input (grammar: targets.fuzz_add_kernels) built field by field: id
    patterns (gaps, descending, duplicates, near 2^63 and 2^40), ledgers per call, sizes,
    memtable limits, clears between calls."""
    w = targets.Writer().u(1, draw(st.integers(0, 255)))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.integers(0, 255))
        w.u(1, op).u(2, draw(st.integers(0, 1100)))
        if op & 0x40:
            w.u(1, draw(st.integers(0, 255)))
        lid = draw(st.integers(0, 255))
        w.u(1, lid)
        if lid >= 0x80:
            w.u(8, draw(u64))
        w.u(1, draw(st.integers(0, 7))).u(8, draw(st.sampled_from(INTERESTING) | u64))
        if op & 3 < 2:
            w.u(2, draw(st.sampled_from([1, 2, 3, 63, 64, 65, 0, -1, -64]) | st.integers(-32768, 32767)))
            if op & 0x80:
                w.u(1, draw(st.integers(0, 255)))
            w.u(1, draw(st.integers(0, 7))).u(4, draw(st.integers(0, 1 << 20)))
            w.u(1, draw(st.integers(0, 255))).u(2, draw(st.integers(0, 0xFFFF)))
        else:
            w.u(8, draw(i64)).u(4, draw(st.integers(0, 0xFFFFFFFF)))
            w.u(1, draw(st.integers(0, 15))).u(4, draw(st.integers(0, 1 << 20)))
            w.u(1, draw(st.integers(0, 255)))
            if op & 0x80:
                w.u(3, draw(st.integers(0, 1 << 24)))
    return w.bytes()


@FAST
@given(st.data())
def test_add_kernels(data):
    raw = data.draw(kernel_inputs())
    _check("add_kernels", data.draw(mutate(raw)) if data.draw(st.integers(0, 3)) == 0 else raw)


@FAST
@given(st.data())
def test_bookie_add(data):
    base = data.draw(st.sampled_from(_seeds("bookie_add")))
    # kind, flags, scope, ledger, key, term, count and the first id's fields of the first frame
    _check("bookie_add", data.draw(mutate(base, [0, 1, 2, 3, 6, 8, 9, 10, 18, 20])))



@FAST
@given(st.data())
def test_bk_wire(data):
    base = data.draw(st.sampled_from(_seeds("bk_wire")))
    # the parser byte, the first frame's length and its header's bytes (version, op, txn)
    _check("bk_wire", data.draw(mutate(base, [0, 1, 4, 5, 6, 7, 8, 9, 10, 11])))

@FAST
@given(st.data())
def test_bk_serve(data):
    base = data.draw(st.sampled_from(_seeds("bk_serve")))
    # the picker byte, the first frame's length and its v2 header (version, opcode, flags)
    _check("bk_serve", data.draw(mutate(base, [0, 1, 4, 5, 6, 7, 8])))


def test_every_target_has_a_hypothesis_test():
    assert {t for t in TARGETS if f"test_{t}" not in globals()} == set()


# -- a brief atheris run of each target ---------------------------------------------------------

def test_atheris_runs_each_target_briefly(tmp_path):
    """CI's share of the fuzzing: each target a few seconds under atheris (the long runs are
    tools/fuzz.py's, by hand); no crash, hang or memory blow-up."""
    import atheris  # noqa: F401  (in the test extra: its absence fails, never skips)
    out = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "fuzz.py"), "--seconds", "2",
                          "--jobs", "2", "--plain",   # the regular build, as CI has
                          "--seed", "1",              # the same inputs each run: no lottery
                          "--workdir", str(tmp_path / "work"),
                          "--crash-dir", str(tmp_path / "crashes")],
                         capture_output=True, text=True, timeout=300)
    results = json.load(open(tmp_path / "work" / "summary.json"))
    assert sorted(r["target"] for r in results) == TARGETS
    for r in results:
        assert r["returncode"] == 0 and not r["crashes"], \
            (r, open(r["log"]).read()[-3000:], out.stdout[-2000:])
        assert r["executions"] and r["executions"] > 10, r


@pytest.mark.soak
def test_the_cython_parsers_coverage_is_visible(tmp_path):
    """The entry-log and index targets are Cython through and through: atheris sees their
    coverage only through clang's hooks, which the runner builds by default (issue: with
    the regular build they ran blind). A check of the fuzzing tool's build, not of the
    code (a minute: two instrumented builds): `make soak-tests`. Both runs start from the same seeds with the same
    libFuzzer seed; the default one must see the native edges."""
    import shutil
    assert shutil.which("clang") or shutil.which("clang-14"), "make test installs clang"

    def run(*extra):
        work = tmp_path / ("plain" if extra else "native")
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "fuzz.py"), "entrylog", "index",
                        "--seconds", "2", "--seed", "1", "--workdir", str(work),
                        "--crash-dir", str(tmp_path / "crashes"), *extra],
                       capture_output=True, text=True, timeout=600, check=True)
        return {r["target"]: r for r in json.load(open(work / "summary.json"))}

    native, plain = run(), run("--plain")
    for t in ("entrylog", "index"):
        assert native[t]["native_coverage"] and native[t]["native_counters"] > 1000, native[t]
        assert native[t].get("cov", 0) > max(100, 2 * plain[t].get("cov", 0)), (native[t], plain[t])
