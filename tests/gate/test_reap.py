"""The reaper: expired leases re-dispatched or failed, lost messages republished, O(due keys)."""

import threading

import pytest

from django_keyed_queue.gate import Cancel, Code, Finish, Lease, Outcome, RecoveryAction, Start, Submission
from django_keyed_queue.gate.keys import KeyNames
from tests.gate_redis import DEADLINES, evalsha_calls, holder, index_scores, set_index_scores
from tests.waiting import wait_until


@pytest.fixture
def quick(make_gate):
    """Leases of 0.3 s and a dispatch timeout of 0.4 s, so deadlines pass within a test."""
    return make_gate(lease_seconds=0.3, dispatch_timeout_seconds=0.4)


def recoveries(gate, **kwargs):
    return gate.reap(**kwargs)[1]


def reap_until(gate, message="a recovery", **kwargs):
    return wait_until(lambda: recoveries(gate, **kwargs), timeout=5, message=message)


def started(gate, key, *, max_lost=1):
    sub = gate.submit(Submission(key, f"msg-{key}".encode()))
    result = gate.start(Start(key, sub.ticket, 1, max_lost=max_lost))
    assert result.ok
    return sub.ticket, result.token


def test_an_expired_lease_is_redispatched_and_only_the_new_message_may_start(quick):
    ticket, token = started(quick, "k", max_lost=1)
    [recovery] = reap_until(quick)
    assert (recovery.action, recovery.ticket, recovery.dispatch, recovery.message) == (
        RecoveryAction.REDISPATCH,
        ticket,
        2,
        b"msg-k",
    )
    assert recovery.action is RecoveryAction.REDISPATCH and f"{recovery.action}" == "redispatch", "logged as before"
    assert holder(quick, "k", ticket).state == "granted"
    assert quick.start(Start("k", ticket, 1)).code is Code.STALE_DISPATCH
    assert quick.finish(Finish("k", ticket, token)).code is Code.STALE_TOKEN, "the lost holder is fenced"
    assert not quick.holds(Lease("k", ticket, token))
    again = quick.start(Start("k", ticket, 2, max_lost=1))
    assert again.ok and again.attempts == 2 and again.token > token
    assert quick.holds(Lease("k", ticket, again.token))


def test_past_its_max_lost_a_ticket_fails_and_the_next_one_is_granted(quick):
    ticket, _ = started(quick, "k", max_lost=0)
    parked = quick.submit(Submission("k", b"next"))
    recoveries = reap_until(quick)
    assert [(r.action, r.ticket) for r in recoveries] == [
        (RecoveryAction.FAIL, ticket),
        (RecoveryAction.GRANT, parked.ticket),
    ]
    assert recoveries[0].message == b"msg-k", "the failed ticket's message names the task to record"
    assert recoveries[1].message == b"next" and recoveries[1].dispatch == 1
    assert set(quick.inspect("k").holders) == {parked.ticket}


def test_a_granted_ticket_never_started_is_republished_with_the_same_dispatch(quick):
    sub = quick.submit(Submission("k", b"lost-message"))
    [recovery] = reap_until(quick)
    assert (recovery.action, recovery.dispatch, recovery.attempts) == (RecoveryAction.REPUBLISH, 1, 0)
    # Both the late original and the republished copy carry dispatch 1: the first start wins.
    assert quick.start(Start("k", sub.ticket, 1)).ok
    assert quick.start(Start("k", sub.ticket, 1)).code is Code.ALREADY_STARTED


def test_a_renewed_lease_is_not_reaped(quick):
    ticket, token = started(quick, "k")
    for _ in range(6):
        assert quick.renew([Lease("k", ticket, token)]) == {Lease("k", ticket, token): True}
        assert not [r for r in recoveries(quick) if r.key == "k"]
        threading.Event().wait(0.1)  # 6 x 0.1 s: twice the lease, renewed all along
    assert quick.holds(Lease("k", ticket, token))


def test_the_index_follows_each_keys_real_next_deadline(make_gate, gate_redis):
    gate = make_gate(lease_seconds=30, dispatch_timeout_seconds=60)
    gate.submit(Submission("idle", b"m"))
    ticket = gate.submit(Submission("busy", b"m")).ticket
    gate.start(Start("busy", ticket, 1))
    [idle_ticket] = gate.inspect("idle").holders
    gate.finish(Finish("idle", idle_ticket, 0))  # not started: stale, the holder stays granted
    gate.cancel(Cancel("idle", idle_ticket))
    # Make every key due now, as if its hint had passed.
    set_index_scores(gate_redis, DEADLINES, {"idle": 0, "busy": 0})
    assert gate.reap() == (2, [])
    index = index_scores(gate_redis, DEADLINES)
    assert "idle" not in index, "an idle key leaves the index"
    lease_end = gate.inspect("busy").holders[ticket].deadline_in
    seconds, micros = gate_redis.time()
    assert index["busy"] == pytest.approx(seconds * 1000 + micros / 1000 + lease_end * 1000, abs=50)


def test_a_dry_run_reports_and_changes_nothing(quick, gate_redis):
    ticket, token = started(quick, "k", max_lost=0)
    quick.submit(Submission("k", b"next"))
    wait_until(lambda: holder(quick, "k", ticket).deadline_in < 0, timeout=5, message="the lease to expire")
    before = (quick.inspect("k"), index_scores(gate_redis, DEADLINES))
    planned = recoveries(quick, dry_run=True)
    assert [r.action for r in planned] == [RecoveryAction.FAIL]
    after = (quick.inspect("k"), index_scores(gate_redis, DEADLINES))
    assert before[0].holders.keys() == after[0].holders.keys() and before[1] == after[1]
    assert [r.action for r in recoveries(quick)] == [RecoveryAction.FAIL, RecoveryAction.GRANT]


def test_reapers_racing_recover_each_ticket_once(make_gate):
    # Leases that end at once, and a dispatch timeout no loaded machine outlasts: each redispatched ticket
    # is due again only after the test (with 0.4 s, 30 passes on a loaded machine saw it due again).
    quick = make_gate(lease_seconds=0.3, dispatch_timeout_seconds=60)
    tickets = {key: started(quick, key, max_lost=3)[0] for key in (f"k{i}" for i in range(20))}
    wait_until(
        lambda: all(holder(quick, k, t).deadline_in < 0 for k, t in tickets.items()),
        timeout=5,
        message="every lease to expire",
    )
    found, lock = [], threading.Lock()

    def reap():
        for _ in range(5):
            done = recoveries(quick)
            with lock:
                found.extend(done)

    threads = [threading.Thread(target=reap) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted((r.key, r.action) for r in found) == sorted((k, RecoveryAction.REDISPATCH) for k in tickets)
    assert all(holder(quick, k, t).dispatch == 2 for k, t in tickets.items())


def test_reaping_touches_only_the_due_keys(make_gate, gate_redis):
    slow = make_gate(lease_seconds=60, dispatch_timeout_seconds=120)
    for i in range(200):
        ticket = slow.submit(Submission(f"far-{i}", b"m")).ticket
        slow.start(Start(f"far-{i}", ticket, 1))
    set_index_scores(gate_redis, DEADLINES, {f"far-{i}": 10**13 for i in range(200)}, xx=True)
    quick = make_gate(lease_seconds=0.2, dispatch_timeout_seconds=0.4)
    ticket, _ = started(quick, "near", max_lost=1)
    calls_before = evalsha_calls(gate_redis)
    [recovery] = reap_until(quick)
    calls = evalsha_calls(gate_redis) - calls_before
    assert recovery.key == "near"
    # Each pass that finds the due key runs its reap script and one reindex: never one per key.
    assert calls < 50


def test_an_unwritten_outcome_is_handed_back_after_the_grace(make_gate, gate_redis):
    gate = make_gate(lease_seconds=30, outcome_grace_seconds=0.3)
    ticket, token = started(gate, "k")
    assert gate.finish(Finish("k", ticket, token, outcome=Outcome("task-1", b"the record"))).ok
    assert gate_redis.hget(KeyNames("k").outcomes, "task-1").endswith(b"|the record")
    gate_redis.zadd(DEADLINES.shard_of("k"), {"k": 0})
    assert recoveries(gate) == [], "within the grace the worker may still write it"
    assert gate_redis.zscore(DEADLINES.shard_of("k"), "k") is not None, "the key stays indexed while an outcome waits"
    [outcome] = wait_until(lambda: recoveries(gate), timeout=5, message="the outcome to be due")
    assert (outcome.action, outcome.message, outcome.publishes) == (RecoveryAction.OUTCOME, b"the record", False)
    gate.forget_outcomes([("k", "task-1")])
    assert not gate_redis.exists(KeyNames("k").outcomes)
    gate_redis.zadd(DEADLINES.shard_of("k"), {"k": 0})
    assert recoveries(gate) == [] and gate_redis.zscore(DEADLINES.shard_of("k"), "k") is None
