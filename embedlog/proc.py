"""What /proc says about a process on this host (Linux)."""
from __future__ import annotations


def process_state(pid: int, tid: int | str | None = None) -> str:
    """The state letter of process ``pid`` (or of its thread ``tid``) from /proc: "T" when
    stopped, "Z" a zombie...; '' when it is gone or cannot be read."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    try:
        with open(path) as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""
