"""The gate's connection to one server, held by its process for its calls (gate/transport.py)."""

from __future__ import annotations

import os
import threading

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_keyed_queue.gate import Gate, NotSent, Submission
from testproject.servers import RedisServer, free_port
from tests.gate.conftest import GATE_SETTINGS
from tests.gate_redis import ON_CLUSTER

pytestmark = pytest.mark.skipif(ON_CLUSTER, reason="one server's transport (a cluster's lends a connection a call)")

CALLS = 200


def _submits(gate: Gate, key: str) -> list[int]:
    return [gate.submit(Submission(key, b"m")).ticket for _ in range(CALLS)]


def _never_retried(url: str) -> Gate:
    """A gate whose client sends a command once, whatever happens (redis-py 6+ retries three times by default)."""
    return Gate(redis.Redis.from_url(url, retry=Retry(NoBackoff(), 0)), **GATE_SETTINGS)


def test_a_forked_child_takes_a_connection_of_its_own_and_leaves_its_parent_s_alone(gate):
    assert gate.submit(Submission("parent", b"m")).ticket == 1  # the parent holds its connection now
    child = os.fork()
    if child == 0:  # the child: its calls' replies must be its own, in order
        try:
            code = 0 if _submits(gate, "child") == list(range(1, CALLS + 1)) else 1
        except BaseException:
            code = 2
        os._exit(code)
    parent = _submits(gate, "parent")  # meanwhile, on the connection it held before the fork
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child's calls had replies of their own, in order"
    assert parent == list(range(2, CALLS + 2)), "the parent's replies were never the child's"


def test_threads_calling_at_once_each_get_their_own_replies(gate):
    results: dict[str, list[int]] = {}

    def call(key: str) -> None:
        results[key] = _submits(gate, key)

    threads = [threading.Thread(target=call, args=(f"k{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert results == {f"k{i}": list(range(1, CALLS + 1)) for i in range(4)}


def test_a_call_after_the_server_closed_the_idle_connection_connects_first(redis_url, gate_redis):
    gate = _never_retried(redis_url)
    gate.submit(Submission("k", b"m1"))
    # As a server's ``timeout`` closes an idle client: every client but this test's own.
    assert gate_redis.client_kill_filter(_type="normal", skipme=True) >= 1

    assert gate.submit(Submission("k", b"m2")).ticket == 2, "sent on a new connection, not lost on the closed one"
    assert gate.inspect("k").last_ticket == 2


def test_a_server_gone_after_the_connection_was_held_is_reported_as_not_sent(tmp_path):
    server = RedisServer(f"redis://127.0.0.1:{free_port()}", tmp_path / "redis")
    server.start()
    try:
        gate = _never_retried(server.url)
        gate.submit(Submission("k", b"m"))
    finally:
        server.stop()
    with pytest.raises(NotSent):  # the held connection's server is gone, and so is any to connect to
        gate.submit(Submission("k", b"m"))
