"""parse_add_body (the bookie's per-entry loop over an ADD body) refuses every malformed
body with the error the earlier version raised, and cuts good ones the same way."""
import random
import struct

import pytest

from embedlog.errors import CorruptedDataError, IllegalOpError
from embedlog.net import protocol as P

U32 = struct.Struct(">I")


def _reference(body):
    if len(body) < 4:
        raise CorruptedDataError("add request without an entry count")
    (count,) = U32.unpack_from(body)
    pos, out = 4, []
    for _ in range(count):
        if pos + 4 > len(body):
            raise CorruptedDataError("add request truncated in an entry size")
        (n,) = U32.unpack_from(body, pos)
        pos += 4
        if pos + n > len(body):
            raise CorruptedDataError("add request truncated in an entry")
        out.append(body[pos:pos + n])
        pos += n
    if pos != len(body):
        raise CorruptedDataError("add request has trailing bytes")
    if not out:
        raise IllegalOpError("add request without entries")
    return out


def _outcome(fn, body):
    try:
        return [bytes(e) for e in fn(body)]
    except (CorruptedDataError, IllegalOpError) as exc:
        return (type(exc), str(exc))


def _body(entries, count=None):
    return (U32.pack(len(entries) if count is None else count)
            + b"".join(U32.pack(len(e)) + e for e in entries))


@pytest.mark.parametrize("seed", range(4))
def test_parse_add_body_agrees_with_the_earlier_loop(seed):
    rnd = random.Random(seed)
    bodies = [b"", b"\0\0\0", _body([]), _body([b"a"], 2), _body([b"a", b""]) + b"x",
              U32.pack(1) + U32.pack(10) + b"short", U32.pack(1) + b"\0\0"]
    for _ in range(300):
        good = _body([bytes(rnd.randrange(50)) for _ in range(rnd.randrange(1, 8))])
        cut = rnd.randrange(len(good) + 1)
        bodies += [good, good[:cut], good + bytes(rnd.randrange(1, 5)),
                   _body([b"x"] * 3, rnd.randrange(0, 6))]
    for body in bodies:
        for view in (body, memoryview(bytearray(body))):
            assert _outcome(P.parse_add_body, view) == _outcome(_reference, view)
