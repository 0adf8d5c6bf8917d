"""The gate's side of the operator's actions: release a holder, refuse a join, list paused keys."""

import time

from django_keyed_queue.gate import Lease, RecoveryAction
from django_keyed_queue.gate.keys import PAUSED_KEYS, KeyNames
from tests.gate_redis import DEADLINES, holder
from tests.waiting import wait_until


def running(gate, key, message=b"m", *, max_lost=1):
    sub = gate.submit(key, message)
    started = gate.start(key, sub.ticket, 1, max_lost=max_lost)
    assert started.ok
    return sub.ticket, started.token


def test_release_of_a_running_holder_fences_it_and_dispatches_it_again(gate, gate_redis):
    ticket, token = running(gate, "k", b"msg", max_lost=1)
    gate_redis.zrem(DEADLINES.shard_of("k"), "k")
    [recovery] = gate.release("k", ticket)
    assert (recovery.action, recovery.ticket, recovery.dispatch, recovery.message) == (
        RecoveryAction.REDISPATCH,
        ticket,
        2,
        b"msg",
    )
    assert not gate.holds(Lease("k", ticket, token)), "the stuck run is fenced at once, its lease not yet expired"
    assert gate.renew([Lease("k", ticket, token)]) == {Lease("k", ticket, token): False}
    assert gate.start("k", ticket, 2, max_lost=1).ok
    assert gate_redis.zscore(DEADLINES.shard_of("k"), "k") is not None, "the reaper watches the re-dispatched message"


def test_release_past_the_recoveries_fails_the_holder_and_grants_the_next(gate):
    ticket, _ = running(gate, "k", max_lost=0)
    parked = gate.submit("k", b"next")
    recoveries = gate.release("k", ticket)
    assert [(r.action, r.ticket) for r in recoveries] == [
        (RecoveryAction.FAIL, ticket),
        (RecoveryAction.GRANT, parked.ticket),
    ]
    assert set(gate.inspect("k").holders) == {parked.ticket}


def test_release_of_a_granted_holder_publishes_it_again_with_its_next_dispatch_once(gate):
    sub = gate.submit("k", b"lost")
    [recovery] = gate.release("k", sub.ticket, dispatch=1)
    assert (recovery.action, recovery.dispatch) == (RecoveryAction.REPUBLISH, 2), "the lost copy cannot start"
    assert holder(gate, "k", sub.ticket).state == "granted"
    assert gate.release("k", sub.ticket, dispatch=1) == [], "a second release of dispatch 1 finds it moved on"
    assert holder(gate, "k", sub.ticket).dispatch == 2


def test_release_of_a_ticket_holding_nothing_changes_nothing(gate, gate_redis):
    ticket, token = running(gate, "k")
    parked = gate.submit("k", b"next")
    before = gate_redis.hgetall(KeyNames("k").holders)
    assert gate.release("k", parked.ticket) == []
    assert gate.release("k", 999) == []
    assert gate_redis.hgetall(KeyNames("k").holders) == before
    assert gate.holds(Lease("k", ticket, token))


def test_a_refused_join_makes_the_later_join_a_duplicate(gate, gate_redis):
    assert gate.refuse_join("k", "task-1", due_in_seconds=5)
    assert gate.submit("k", b"m", start=True, join_id="task-1") is None
    assert gate.inspect("k").last_ticket == 0, "no ticket was taken"
    assert gate_redis.pttl(KeyNames("k").joined) > 3_600_000, "kept until due plus the idle horizon"


def test_a_join_that_happened_cannot_be_refused(gate):
    joined = gate.submit("k", b"m", start=True, join_id="task-1")
    assert joined is not None and joined.granted
    assert not gate.refuse_join("k", "task-1")


def test_refusing_a_join_keeps_the_other_joins_working(gate):
    assert gate.refuse_join("k", "task-1")
    assert gate.submit("k", b"m", start=True, join_id="task-2") is not None


def test_paused_keys_are_listed_until_resumed(gate, gate_redis):
    gate.pause("b")
    gate.pause("a{x}")
    assert gate.paused_keys() == ["a{x}", "b"]
    gate.resume("b")
    assert gate.paused_keys() == ["a{x}"]
    assert gate.resume("never-paused") is None, "a key not paused is told so"
    assert gate.resume("b") is None, "as is one resumed already"
    assert gate_redis.smembers(PAUSED_KEYS) == {b"a{x}"}


def test_inspect_many_reads_each_key(gate):
    ticket, _ = running(gate, "busy")
    parked = gate.submit("busy", b"next")
    gate.pause("idle")
    busy, idle, unknown = gate.inspect_many(["busy", "idle", "unknown"])
    assert (busy.key, busy.waiting, list(busy.holders)) == ("busy", [parked.ticket], [ticket])
    assert busy.holders[ticket].state == "running" and 0 < busy.holders[ticket].deadline_in <= 30
    assert idle.paused and not busy.paused
    assert (unknown.last_ticket, unknown.waiting, unknown.holders, unknown.paused) == (0, [], {}, False)
    assert gate.inspect_many([]) == []


def test_inspect_reads_only_the_waiting_tickets_it_shows(gate, gate_redis):
    gate.pause("deep")
    for _ in range(1000):
        gate.submit("deep", b"m")
    shown, counted, everything = (gate.inspect("deep", waiting_shown=n) for n in (5, 0, None))
    assert (shown.waiting, shown.depth) == ([1, 2, 3, 4, 5], 1000)
    assert (counted.waiting, counted.depth) == ([], 1000)
    assert everything.waiting == list(range(1, 1001))


def test_paused_keys_are_read_in_bounded_steps(gate, gate_redis):
    for n in range(50):
        gate.pause(f"k{n:02}")
    some = gate.paused_keys(limit=10)
    assert len(some) == 10 and set(some) <= set(gate.paused_keys())
    assert gate.paused_keys(limit=100) == gate.paused_keys() == [f"k{n:02}" for n in range(50)]


def test_a_given_up_run_is_fenced_now_and_failed_without_recovery_after_the_grace(make_gate, gate_redis):
    gate = make_gate(lease_seconds=30)
    ticket, token = running(gate, "k", max_lost=3)
    parked = gate.submit("k", b"next")
    assert gate.give_up("k", ticket, 1, grace_seconds=0.5)
    assert not gate.holds(Lease("k", ticket, token)), "fenced at once: the killed run's writes are refused"
    assert not gate.finish("k", ticket, token).ok
    assert gate.reap()[1] == [], "the slot stays held through the grace: the next task must not overlap"
    looks_at = gate_redis.zscore(DEADLINES.shard_of("k"), "k")
    assert looks_at <= (time.time() + 0.5) * 1000, "the reaper looks after the grace"
    recoveries = wait_until(lambda: gate.reap()[1], timeout=5, message="the grace to pass")
    assert [(r.action, r.ticket) for r in recoveries] == [
        (RecoveryAction.FAIL, ticket),
        (RecoveryAction.GRANT, parked.ticket),
    ]


def test_giving_up_a_ticket_that_does_not_run_changes_nothing(gate, gate_redis):
    ticket, token = running(gate, "k")
    granted = gate.submit("other", b"m")
    before = {name: gate_redis.hgetall(KeyNames(name).holders) for name in ("k", "other")}
    assert not gate.give_up("k", ticket, 2, grace_seconds=1), "another dispatch than the killed run's"
    assert not gate.give_up("other", granted.ticket, 1, grace_seconds=1), "granted, not started"
    assert not gate.give_up("k", 999, 1, grace_seconds=1)
    assert {name: gate_redis.hgetall(KeyNames(name).holders) for name in ("k", "other")} == before
    assert gate.holds(Lease("k", ticket, token))


def test_a_pause_keeps_who_paused_the_key_and_when_until_it_is_resumed(gate, gate_redis):
    before = time.time()
    gate.pause("k", by="olga (admin)")
    snapshot = gate.inspect("k")
    assert snapshot.paused and snapshot.paused_by == "olga (admin)"
    assert snapshot.paused_since is not None and before - 1 <= snapshot.paused_since <= time.time() + 1
    gate.pause("k", by="x" * 1000)
    assert gate.inspect("k").paused_by == "x" * 200, "kept to 200 characters"
    gate.resume("k")
    resumed = gate.inspect("k")
    assert (resumed.paused, resumed.paused_since, resumed.paused_by) == (False, None, "")
    # Written by someone else: read without failing.
    gate_redis.hset(KeyNames("k").meta, mapping={"paused": "not a time", "paused_by": b"\xff\xfe"})
    odd = gate.inspect("k")
    assert (odd.paused, odd.paused_since, odd.paused_by) == (True, None, "\ufffd\ufffd")


def test_waiting_ahead_counts_the_tickets_before_one_in_its_queue(gate):
    ticket, _ = running(gate, "k")
    parked = [gate.submit("k", f"m{n}".encode()).ticket for n in range(3)]
    assert [gate.waiting_ahead("k", t) for t in parked] == [0, 1, 2]
    assert gate.waiting_ahead("k", ticket) is None, "a holder does not wait"
    assert gate.waiting_ahead("other", 1) is None
