"""Drained keys: only the counters remain, while the key's recent submissions are remembered (a minute), or a
paced key's interval runs, at most the idle horizon; then nothing. Busy keys never expire."""

from __future__ import annotations

from django_keyed_queue.gate import Cancel, Finish, Lease, Start, Submission
from django_keyed_queue.gate.keys import KeyNames
from tests.gate_redis import redis_names
from tests.waiting import wait_until

HORIZON_MS = 3_600_000  # the ``gate`` fixture's idle horizon
#: Two generations of recent submissions (``gate.submit.RECENT_SUBMISSION_SECONDS``): how long a drained key
#: keeps its counters.
RECENT_MS = 60_000


def _assert_idle(client, key: str, keep_ms: int = RECENT_MS) -> None:
    names = KeyNames(key)
    assert redis_names(client) - {names.recent} == {names.meta}, "an idle key keeps only its meta hash"
    assert keep_ms - 1000 < client.pttl(names.meta) <= keep_ms


def _assert_busy(client) -> None:
    # The index of recent task ids expires on its own, busy or not.
    ttls = {name: client.pttl(name) for name in redis_names(client) if ":recent" not in name}
    assert ttls and all(ttl == -1 for ttl in ttls.values()), f"a busy key must not expire: {ttls}"


def test_a_key_is_idle_after_its_last_finish(gate, gate_redis):
    first = gate.submit(Submission("k", b"m1", start=True, task_id="t1"))
    gate.submit(Submission("k", b"m2", task_id="t2"))
    _assert_busy(gate_redis)

    (grant,) = gate.finish(Finish("k", first.ticket, first.token)).granted
    _assert_busy(gate_redis)
    started = gate.start(Start("k", grant.ticket, grant.dispatch))
    _assert_busy(gate_redis)
    gate.finish(Finish("k", grant.ticket, started.token))

    _assert_idle(gate_redis, "k")
    state = gate.inspect("k")
    assert RECENT_MS / 1000 - 1 < state.idle_expires_in <= RECENT_MS / 1000
    assert (state.last_ticket, state.last_token) == (2, started.token), "the counters outlive the work"
    assert started.token == first.token + 1


def test_a_key_is_idle_after_its_last_cancel(gate, gate_redis):
    gate.submit(Submission("k", b"m1", task_id="t1"))
    gate.submit(Submission("k", b"m2", task_id="t2"))

    gate.cancel(Cancel("k", 2))
    _assert_busy(gate_redis)
    gate.cancel(Cancel("k", 1))

    _assert_idle(gate_redis, "k")


def test_cancelling_the_last_waiting_ticket_behind_a_running_one_keeps_the_key_busy(gate, gate_redis):
    first = gate.submit(Submission("k", b"m1", start=True, task_id="t1"))
    gate.submit(Submission("k", b"m2", task_id="t2"))

    gate.cancel(Cancel("k", 2))

    _assert_busy(gate_redis)
    assert gate.inspect("k").idle_expires_in is None
    gate.finish(Finish("k", first.ticket, first.token))
    _assert_idle(gate_redis, "k")


def test_a_retrying_key_is_busy(gate, gate_redis):
    first = gate.submit(Submission("k", b"m1", start=True))

    gate.retry(Lease("k", first.ticket, first.token), b"m1", countdown_seconds=5)

    _assert_busy(gate_redis)


def test_a_paused_key_with_waiting_tickets_is_busy(gate, gate_redis):
    first = gate.submit(Submission("k", b"m1", start=True))
    gate.submit(Submission("k", b"m2"))
    gate_redis.hset(KeyNames("k").meta, "paused", "1")

    gate.finish(Finish("k", first.ticket, first.token))

    _assert_busy(gate_redis)


def test_stale_calls_on_an_idle_key_leave_its_ttl_alone(gate, gate_redis):
    # With a task id, the drained key keeps its counters while its recent submission is remembered (a
    # minute). Without one it keeps them a millisecond: the TTL set below would race their expiry.
    first = gate.submit(Submission("k", b"m1", start=True, task_id="t1"))
    gate.finish(Finish("k", first.ticket, first.token))
    assert gate_redis.pexpire(KeyNames("k").meta, 50_000), "the idle key keeps its counters"

    assert not gate.start(Start("k", first.ticket, 1)).ok
    assert not gate.finish(Finish("k", first.ticket, first.token)).ok
    assert not gate.cancel(Cancel("k", first.ticket)).ok
    assert gate.retry(Lease("k", first.ticket, first.token), b"m", countdown_seconds=0) is None

    assert redis_names(gate_redis) - {KeyNames("k").recent} == {KeyNames("k").meta}
    assert 49_000 < gate_redis.pttl(KeyNames("k").meta) <= 50_000


def test_submit_makes_an_idle_key_busy_again(gate, gate_redis):
    first = gate.submit(Submission("k", b"m1", start=True, task_id="t1"))
    gate.finish(Finish("k", first.ticket, first.token))
    assert gate_redis.pttl(KeyNames("k").meta) > 0

    second = gate.submit(Submission("k", b"m2", task_id="t2"))

    assert second.ticket == 2
    _assert_busy(gate_redis)
    assert gate.inspect("k").idle_expires_in is None


def test_a_parked_submit_also_makes_the_key_busy(gate, gate_redis):
    gate.submit(Submission("k", b"m1", task_id="t1"))  # remembered: the drained key keeps its counters a minute
    gate.cancel(Cancel("k", 1))
    gate_redis.hset(KeyNames("k").meta, "paused", "1")

    assert not gate.submit(Submission("k", b"m2")).granted

    _assert_busy(gate_redis)


def test_join_ids_expire_within_the_horizon(gate, gate_redis):
    first = gate.submit(Submission("k", b"m1", start=True, join_id="task-1"))
    gate.finish(Finish("k", first.ticket, first.token))

    names = KeyNames("k")
    assert redis_names(gate_redis) - {names.meta} == {names.joined}, "the join's duplicate guard outlives the counters"
    assert HORIZON_MS - 1000 < gate_redis.pttl(names.joined) <= HORIZON_MS


def test_an_idle_key_is_gone_after_a_tiny_horizon(make_gate, gate_redis):
    gate = make_gate(idle_horizon_seconds=0.2)
    first = gate.submit(Submission("k", b"m1", start=True, join_id="task-1"))
    gate.submit(Submission("k", b"m2"))
    (grant,) = gate.finish(Finish("k", first.ticket, first.token)).granted
    started = gate.start(Start("k", grant.ticket, grant.dispatch))
    assert gate_redis.pttl(KeyNames("k").meta) == -1

    gate.finish(Finish("k", grant.ticket, started.token))
    assert gate_redis.pttl(KeyNames("k").meta) <= 200  # -2 once gone

    wait_until(lambda: not redis_names(gate_redis), timeout=5, message="the idle key to expire")
    # Everything is gone, counters included: tickets start over, fencing tokens in a new epoch above the old.
    again = gate.submit(Submission("k", b"m3", start=True, join_id="task-1"))
    assert again.ticket == 1 and again.token > started.token


def test_a_busy_key_outlives_a_tiny_horizon(make_gate, gate_redis):
    gate = make_gate(idle_horizon_seconds=0.05)
    first = gate.submit(Submission("k", b"m1", start=True))
    gate.submit(Submission("k", b"m2"))
    # Another key goes idle and expires: proof that the horizon has passed, without a fixed sleep.
    other = gate.submit(Submission("other", b"m", start=True))
    gate.finish(Finish("other", other.ticket, other.token))
    wait_until(lambda: gate_redis.exists(KeyNames("other").meta) == 0, timeout=5, message="the other key to expire")

    state = gate.inspect("k")
    assert state.last_ticket == 2 and state.waiting == [2]
    assert gate.finish(Finish("k", first.ticket, first.token)).granted[0].ticket == 2


def test_a_drained_key_without_submissions_to_remember_leaves_nothing_and_its_tokens_go_on(gate, gate_redis):
    first = gate.submit(Submission("k", b"m1", start=True))  # no task id: nothing to remember for a retried submit
    gate.finish(Finish("k", first.ticket, first.token))

    wait_until(lambda: not redis_names(gate_redis), timeout=5, message="the drained key to leave nothing")
    again = gate.submit(Submission("k", b"m2", start=True))
    assert again.ticket == 1 and again.token > first.token, "tickets start over; tokens go on, above"


def test_a_paced_key_keeps_its_last_start_while_its_interval_runs(gate, gate_redis):
    first = gate.submit(Submission("k", b"m1"))
    started = gate.start(Start("k", first.ticket, 1, interval_ms=90_000))
    gate.finish(Finish("k", first.ticket, started.token))

    assert 89_000 < gate_redis.pttl(KeyNames("k").meta) <= 90_000, "kept while the interval runs"
    second = gate.submit(Submission("k", b"m2"))
    refused = gate.start(Start("k", second.ticket, 1, interval_ms=90_000))
    assert refused.code.name == "TOO_EARLY" and refused.wait_seconds > 89, "the key's pace holds across its drain"
