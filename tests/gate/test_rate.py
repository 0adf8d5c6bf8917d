"""``rate=`` in the gate: a key's starts are at least an interval apart; a start too soon is refused
with the wait, and the holder's dispatch deadline moves past it."""

import time

from django_keyed_queue.gate import Code, Start, Submission
from tests.gate_redis import holder

INTERVAL_MS = 300


def granted(gate, key="k", limit=2, n=2):
    return [gate.submit(Submission(key, f"msg-{i}".encode(), limit=limit)).ticket for i in range(n)]


def test_a_start_sooner_than_the_interval_after_the_last_is_refused_with_the_wait(gate):
    first, second = granted(gate)
    assert gate.start(Start("k", first, 1, interval_ms=INTERVAL_MS)).ok

    early = gate.start(Start("k", second, 1, interval_ms=INTERVAL_MS))
    assert early.code is Code.TOO_EARLY and early.message == b"msg-1"
    assert 0.2 < early.wait_seconds <= INTERVAL_MS / 1000
    assert holder(gate, "k", second).state == "granted", "still granted, not started"
    assert gate.wait_to_start("k", second, 1, interval_ms=INTERVAL_MS)[1] == b"msg-1"

    time.sleep(early.wait_seconds)
    assert gate.wait_to_start("k", second, 1, interval_ms=INTERVAL_MS) == (0.0, None)
    assert gate.start(Start("k", second, 1, interval_ms=INTERVAL_MS)).ok


def test_a_wait_sets_the_dispatch_deadline_to_a_lease_past_the_time_it_may_start(make_gate):
    gate = make_gate(dispatch_timeout_seconds=0.05, lease_seconds=1)
    first, second = granted(gate)
    assert gate.start(Start("k", first, 1, interval_ms=5000)).ok
    wait, _ = gate.wait_to_start("k", second, 1, interval_ms=5000)
    assert wait > 4.5
    assert wait + 0.5 < holder(gate, "k", second).deadline_in <= wait + 1, "the reaper leaves it until then"

    slow = make_gate(dispatch_timeout_seconds=600, lease_seconds=1)
    [third] = granted(slow, n=1, limit=3)
    slow.wait_to_start("k", third, 1, interval_ms=5000)
    assert holder(slow, "k", third).deadline_in < 10, "a message sent for later, if lost, is published again soon"


def test_keys_are_paced_apart_and_a_task_without_a_rate_is_not_held(gate):
    [a] = granted(gate, "a", n=1)
    [b] = granted(gate, "b", n=1)
    assert gate.start(Start("a", a, 1, interval_ms=10_000)).ok
    assert gate.start(Start("b", b, 1, interval_ms=10_000)).ok, "another key's starts do not count"
    [again] = granted(gate, "a", n=1)
    assert gate.start(Start("a", again, 1)).ok, "a start with no interval is not held by the key's last"


def test_only_the_granted_dispatch_is_told_to_wait(gate):
    first, second = granted(gate)
    assert gate.start(Start("k", first, 1, interval_ms=INTERVAL_MS)).ok
    assert gate.wait_to_start("k", first, 1, interval_ms=INTERVAL_MS) == (0.0, None), "running already"
    assert gate.wait_to_start("k", second, 2, interval_ms=INTERVAL_MS) == (0.0, None), "another dispatch"
    assert gate.wait_to_start("k", 99, 1, interval_ms=INTERVAL_MS) == (0.0, None), "no such ticket"


def test_a_paused_key_keeps_its_last_start(gate):
    first, second = granted(gate)
    assert gate.start(Start("k", first, 1, interval_ms=10_000)).ok
    gate.pause("k")
    gate.resume("k")
    assert gate.start(Start("k", second, 1, interval_ms=10_000)).code is Code.TOO_EARLY
