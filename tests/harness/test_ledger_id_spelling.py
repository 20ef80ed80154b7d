"""Messages spell a ledger id one way (issue 27, item 4): str(LedgerId), the plain number in
scope 0 and the 32-hex-digit qualified name otherwise, from Python and native code alike."""
import pytest

import embedlog
from embedlog.errors import EmbedlogError


@pytest.mark.parametrize("scope", [0, 7])
def test_errors_name_a_ledger_as_str_of_its_id(tmp_path, scope):
    with embedlog.open(str(tmp_path / "d")) as log:
        w = log.create_ledger(scope_id=scope)
        w.append(b"x")
        w.close()
        lid = w.ledger_id
        r = log.open_ledger(lid)
        messages = []
        for call in (lambda: r.read_entry(5),                     # native: past the LAC
                     lambda: log.open_ledger(lid, password=b"wrong"),   # Python
                     lambda: w.append(b"y")):                     # Python: closed
            with pytest.raises(EmbedlogError) as info:
                call()
            messages.append(str(info.value))
    for m in messages:
        assert f"ledger {lid}" in m, m
        assert "LedgerId(" not in m and f"({scope}, " not in m, m
