"""One bookie's storage: journal, ledger storage (memtable, entry logs, index), recovery."""
from embedlog.bookie.bookie import Bookie

__all__ = ["Bookie"]
