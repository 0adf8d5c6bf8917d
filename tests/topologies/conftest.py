"""The gate on a Redis Cluster and behind Sentinel (``make topologies``), in the user's project."""

from __future__ import annotations

import pytest

from testproject.topologies import LocalSentinel
from tests.redis_connections import disconnect_clients


@pytest.fixture(scope="session")
def cluster(gate_cluster):
    """A local Redis Cluster of 3 masters, shared by the tier's tests (each empties it first)."""
    return gate_cluster


@pytest.fixture
def sentinel(workdir):
    """1 master, 1 replica and 3 sentinels of the test's own: a failover changes who is master."""
    with LocalSentinel(workdir / "sentinel") as started:
        yield started
        disconnect_clients({server.port for server in [*started.data_nodes, *started.sentinels]})
