"""The gate on a Redis Cluster and behind Sentinel (``make topologies``), in the user's project."""

from __future__ import annotations

import pytest

from testproject.topologies import LocalCluster, LocalSentinel
from tests.conftest import disconnect_clients
from tests.userproject.conftest import make_project, project_template, user_redis, workdir  # noqa: F401 (fixtures)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    """A local Redis Cluster of 3 masters, shared by the tier's tests (each empties it first)."""
    with LocalCluster(tmp_path_factory.mktemp("cluster")) as started:
        yield started
        disconnect_clients({node.port for node in started.nodes})


@pytest.fixture
def sentinel(workdir):  # noqa: F811 (the fixture imported above)
    """1 master, 1 replica and 3 sentinels of the test's own: a failover changes who is master."""
    with LocalSentinel(workdir / "sentinel") as started:
        yield started
        disconnect_clients({server.port for server in [*started.data_nodes, *started.sentinels]})
