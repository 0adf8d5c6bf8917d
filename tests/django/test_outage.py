"""One outage policy: a worker's call after the fact (here a delayed task's join) waits out a Redis
restart; a producer's submission to a Redis that is down fails at once, having taken nothing."""

import threading
import time

import pytest
import redis

from django_keyed_queue.gate import Gate, NotSent, Submission
from django_keyed_queue.producer.submit import take_ticket
from testproject.servers import RedisServer, free_port


@pytest.fixture
def redis_later(tmp_path):
    """A Redis that is down now, on a port a gate can be pointed at; ``.start()`` brings it up."""
    server = RedisServer(f"redis://127.0.0.1:{free_port()}", tmp_path / "redis")
    yield server
    server.stop()


@pytest.fixture
def gate(redis_later):
    client = redis.Redis.from_url(redis_later.url, socket_connect_timeout=1, socket_timeout=5)
    yield Gate(client, lease_seconds=30, dispatch_timeout_seconds=60, idle_horizon_seconds=3600)
    client.close()


def test_a_delayed_tasks_join_waits_out_a_redis_restart(redis_later, gate):
    restart = threading.Timer(0.5, redis_later.launch)
    restart.start()
    began = time.monotonic()
    try:
        joining = Submission("outage", b"m", "t-1", start=True, join_id="t-1")
        joined = take_ticket(gate, "demo.step", joining, wait_out_outage=True)
    finally:
        restart.join()  # within this test: its server is never stopped under it, nor a failure told in another
    assert joined is not None and joined.granted and joined.token > 0
    assert 0.4 < time.monotonic() - began < 15
    assert gate.inspect("outage").holders[joined.ticket].state == "running"


def test_a_producer_fails_at_once_when_redis_is_down(redis_later, gate):
    began = time.monotonic()
    with pytest.raises(NotSent):
        take_ticket(gate, "demo.step", Submission("outage", b"m", "t-2"))
    assert time.monotonic() - began < 3
    redis_later.start()
    assert gate.inspect("outage").last_ticket == 0  # nothing was taken
