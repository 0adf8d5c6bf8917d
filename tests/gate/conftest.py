import pytest

from django_keyed_queue.gate import Gate
from tests.conftest import WORKERLESS_GATE_DB, disconnect_clients

from ._support import ON_CLUSTER, connect_to

#: The settings of the ``gate`` fixture; ``make_gate`` overrides some of them.
GATE_SETTINGS = {"lease_seconds": 30, "dispatch_timeout_seconds": 60, "idle_horizon_seconds": 3600}


@pytest.fixture
def gate_db() -> int:
    return WORKERLESS_GATE_DB


@pytest.fixture(scope="session")
def gate_cluster(tmp_path_factory):
    """A local Redis Cluster of 3 masters, for the tier's run on a cluster (``make topologies``)."""
    from testproject.topologies import LocalCluster

    with LocalCluster(tmp_path_factory.mktemp("cluster")) as cluster:
        yield cluster
        disconnect_clients({node.port for node in cluster.nodes})


if ON_CLUSTER:

    @pytest.fixture
    def redis_url(gate_cluster) -> str:
        return gate_cluster.url

    @pytest.fixture
    def gate_redis(gate_cluster):
        """The cluster, emptied for each test."""
        gate_cluster.flushall()
        client = connect_to(gate_cluster.url)
        yield client
        client.close()

else:

    @pytest.fixture
    def redis_url(redis_server) -> str:
        """The gate database's URL, for threads and processes that open their own clients."""
        return f"{redis_server.url}/{WORKERLESS_GATE_DB}"


@pytest.fixture
def gate(gate_redis) -> Gate:
    return Gate(gate_redis, **GATE_SETTINGS)


@pytest.fixture
def make_gate(gate_redis):
    """A Gate on the test's Redis with some settings changed, e.g. a tiny idle horizon."""

    def make(**overrides) -> Gate:
        return Gate(gate_redis, **{**GATE_SETTINGS, **overrides})

    return make
