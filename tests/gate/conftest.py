import pytest

from django_keyed_queue.gate import Gate
from tests.gate_redis import ON_CLUSTER, WORKERLESS_GATE_DB

#: The settings of the ``gate`` fixture; ``make_gate`` overrides some of them.
GATE_SETTINGS = {"lease_seconds": 30, "dispatch_timeout_seconds": 60, "idle_horizon_seconds": 3600}


@pytest.fixture
def gate_db() -> int:
    return WORKERLESS_GATE_DB


if ON_CLUSTER:

    @pytest.fixture
    def redis_url(gate_cluster) -> str:
        return gate_cluster.url

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
