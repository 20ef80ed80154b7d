"""Helpers the Spark tests share."""
from embedlog.spark.commit import TARGET_KEY, TASK_SCOPE_ID, Target


def markers(client, stream: str) -> list:
    """The task markers of writes to ``stream``. The session shares one cluster: a query
    another test stopped may leave markers of its own sink until that sink commits again
    (docs/SPARK.md), so tests count only their own."""
    key = Target(stream=stream).key.encode()
    return [lid for lid in client.list_ledgers(TASK_SCOPE_ID)
            if client.ledger_metadata(lid).custom_metadata.get(TARGET_KEY) == key]
