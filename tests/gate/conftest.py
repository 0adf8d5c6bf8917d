import pytest

from django_keyed_queue.gate import Gate


@pytest.fixture
def gate(gate_redis) -> Gate:
    return Gate(gate_redis, lease_seconds=30, dispatch_timeout_seconds=60, idle_horizon_seconds=3600)
