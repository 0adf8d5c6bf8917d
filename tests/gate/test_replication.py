"""KEYED_QUEUE_REDIS_WAIT_REPLICAS: each round trip that changes the gate waits for replicas to acknowledge it."""

from __future__ import annotations

import time

import pytest

from django_keyed_queue.gate import ReplicasBehind, Submission
from tests.gate_redis import ON_CLUSTER


def test_without_replicas_a_transition_that_must_wait_for_one_fails_after_the_timeout(make_gate):
    gate = make_gate(wait_replicas=1, wait_timeout_seconds=0.2)
    started = time.monotonic()
    with pytest.raises(
        ReplicasBehind, match="0 of the 1 replicas required acknowledged the gate's writes within 200 ms"
    ):
        gate.submit(Submission("k", b"m1", task_id="t1"))
    assert time.monotonic() - started >= 0.19, "it waited for the replica"
    # It ran on the master: asked again, as a caller does after a lost reply, it finds the same ticket.
    again = make_gate().submit(Submission("k", b"m1", task_id="t1"), retried=True)
    assert (again.ticket, again.granted) == (1, True)


def test_a_read_waits_for_nothing(make_gate):
    gate = make_gate(wait_replicas=1, wait_timeout_seconds=5)
    started = time.monotonic()
    assert gate.reap() == (0, [])
    assert gate.overdue_keys(0) == []
    assert time.monotonic() - started < 1


@pytest.mark.skipif(ON_CLUSTER, reason="one server's replicas: the cluster's are in tests/topologies")
def test_no_wait_is_sent_unless_asked(make_gate, gate_redis):
    before = gate_redis.info("commandstats").get("cmdstat_wait", {}).get("calls", 0)
    make_gate().submit(Submission("k", b"m"))
    assert gate_redis.info("commandstats").get("cmdstat_wait", {}).get("calls", 0) == before
