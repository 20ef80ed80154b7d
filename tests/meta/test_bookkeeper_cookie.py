"""An embedlog bookie's cookie on a BookKeeper root is kept in BookKeeper's cookie format
(issue 29 item 2): the translation both ways, without ZooKeeper. The stored bytes read by
BookieShell cookie_get are tests/interop/test_bookkeeper_bookie.py's."""
import pytest

from embedlog.bookie.cookies import Cookie as EmbedlogCookie
from embedlog.errors import MetadataError
from embedlog.meta.bookkeeper import cookie as bk


def test_an_embedlog_cookie_is_written_as_bookkeepers_and_read_back():
    ours = EmbedlogCookie("bookie-00ab", "5f0c6a2e-1d1b-4f4e-9f61-7d0b4b1f0a11", "journal",
                          (".", "/disks/d2"), "zk+hierarchical://h:2181/ledgers")
    stored = bk.from_embedlog(ours.to_bytes())
    assert stored.startswith(b"5\n")
    parsed = bk.Cookie.from_bytes(stored)
    assert (parsed.bookie_id, parsed.journal_dirs, parsed.ledger_dirs, parsed.instance_id) == (
        "bookie-00ab", "journal", "2\t.\t/disks/d2", ours.instance_id)
    back = EmbedlogCookie.from_bytes(bk.to_embedlog(stored), "read back")
    # metadata_uri is only informative and has no field in BookKeeper's cookie
    assert back == EmbedlogCookie(ours.bookie_id, ours.instance_id, ours.journal_dir,
                                  ours.ledger_dirs, None)
    assert back.same_dirs(ours)


def test_other_records_among_cookies_pass_as_they_are():
    assert bk.from_embedlog(b'{"holder": "x"}') is None
    assert bk.to_embedlog(b'{"holder": "x"}') == b'{"holder": "x"}'
    ours = EmbedlogCookie("bookie-1", "i", "journal", (".",)).to_bytes()
    assert bk.to_embedlog(ours) == ours            # written before this change: as it is


def test_a_damaged_embedlog_record_is_refused():
    with pytest.raises(MetadataError):
        bk.from_embedlog(bk.EMBEDLOG_COOKIE_MAGIC + b"{not json")
