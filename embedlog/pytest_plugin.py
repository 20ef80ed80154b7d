"""pytest fixtures for applications that use embedlog (registered through the pytest11
entry point, the way kazoo ships a ZooKeeper harness):

- ``embedlog_log``: an embedded log in a temporary directory, closed after the test;
- ``embedlog_cluster``: a LocalCluster of 3 bookie processes (SQLite metadata) with its
  fault verbs (kill_bookie, suspend_bookie, restart_bookie, set_read_only, proxy(i)...);
- ``embedlog_cluster_factory``: call it with LocalCluster's arguments for other shapes.
"""
import pytest


@pytest.fixture
def embedlog_log(tmp_path):
    # start-up cost: pytest loads this plugin in every session of every project that
    # installs embedlog; the engine loads only when a test asks for the fixture
    import embedlog
    log = embedlog.open(tmp_path / "embedlog")
    try:
        yield log
    finally:
        log.close()


@pytest.fixture
def embedlog_cluster_factory(tmp_path):
    # start-up cost, as above: the harness loads only for a test that uses it
    from embedlog.harness import LocalCluster
    made = []

    def make(bookies=3, metadata="sqlite", **kwargs):
        lc = LocalCluster(bookies=bookies, metadata=metadata,
                          base_dir=str(tmp_path / f"embedlog-cluster-{len(made)}"), **kwargs)
        made.append(lc)
        return lc

    try:
        yield make
    finally:
        # every cluster is closed even when one reports a crashed bookie; the first report
        # is raised after
        failure = None
        for lc in made:
            try:
                lc.close()
            except Exception as exc:     # noqa: BLE001 - the others still need closing
                failure = failure or exc
        if failure is not None:
            raise failure


@pytest.fixture
def embedlog_cluster(embedlog_cluster_factory):
    return embedlog_cluster_factory()
