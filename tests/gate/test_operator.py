"""The gate's side of the operator's actions: release a holder, refuse a join, list paused keys."""

import time

from django_keyed_queue.gate import Lease, RecoveryAction, Start, Submission
from django_keyed_queue.gate.keys import PAUSED_KEYS, KeyNames
from tests.gate_redis import DEADLINES, holder
from tests.waiting import wait_until


def running(gate, key, message=b"m", *, max_lost=1):
    sub = gate.submit(Submission(key, message))
    started = gate.start(Start(key, sub.ticket, 1, max_lost=max_lost))
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
    assert gate.start(Start("k", ticket, 2, max_lost=1)).ok
    assert gate_redis.zscore(DEADLINES.shard_of("k"), "k") is not None, "the reaper watches the re-dispatched message"


def test_release_past_the_recoveries_fails_the_holder_and_grants_the_next(gate):
    ticket, _ = running(gate, "k", max_lost=0)
    parked = gate.submit(Submission("k", b"next"))
    recoveries = gate.release("k", ticket)
    assert [(r.action, r.ticket) for r in recoveries] == [
        (RecoveryAction.FAIL, ticket),
        (RecoveryAction.GRANT, parked.ticket),
    ]
    assert set(gate.inspect("k").holders) == {parked.ticket}


def test_release_of_a_granted_holder_publishes_it_again_with_its_next_dispatch_once(gate):
    sub = gate.submit(Submission("k", b"lost"))
    [recovery] = gate.release("k", sub.ticket, dispatch=1)
    assert (recovery.action, recovery.dispatch) == (RecoveryAction.REPUBLISH, 2), "the lost copy cannot start"
    assert holder(gate, "k", sub.ticket).state == "granted"
    assert gate.release("k", sub.ticket, dispatch=1) == [], "a second release of dispatch 1 finds it moved on"
    assert holder(gate, "k", sub.ticket).dispatch == 2


def test_a_release_of_an_unstarted_holder_leaves_one_that_started_meanwhile_running(gate, gate_redis):
    sub = gate.submit(Submission("k", b"m"))
    started = gate.start(Start("k", sub.ticket, 1))  # a worker started it after the operator saw it granted
    before = gate_redis.hgetall(KeyNames("k").holders)
    assert gate.release("k", sub.ticket, dispatch=1, unstarted=True) == []
    assert gate_redis.hgetall(KeyNames("k").holders) == before and gate.holds(Lease("k", sub.ticket, started.token))
    granted = gate.submit(Submission("other", b"m"))
    [recovery] = gate.release("other", granted.ticket, dispatch=1, unstarted=True)
    assert (recovery.action, recovery.dispatch) == (RecoveryAction.REPUBLISH, 2)


def test_release_of_a_ticket_holding_nothing_changes_nothing(gate, gate_redis):
    ticket, token = running(gate, "k")
    parked = gate.submit(Submission("k", b"next"))
    before = gate_redis.hgetall(KeyNames("k").holders)
    assert gate.release("k", parked.ticket) == []
    assert gate.release("k", 999) == []
    assert gate_redis.hgetall(KeyNames("k").holders) == before
    assert gate.holds(Lease("k", ticket, token))


def test_a_refused_join_makes_the_later_join_a_duplicate(gate, gate_redis):
    assert gate.refuse_join("k", "task-1", due_in_seconds=5)
    assert gate.submit(Submission("k", b"m", start=True, join_id="task-1")) is None
    assert gate.inspect("k").last_ticket == 0, "no ticket was taken"
    assert gate_redis.pttl(KeyNames("k").joined) > 3_600_000, "kept until due plus the idle horizon"


def test_a_join_that_happened_cannot_be_refused(gate):
    joined = gate.submit(Submission("k", b"m", start=True, join_id="task-1"))
    assert joined is not None and joined.granted
    assert not gate.refuse_join("k", "task-1")


def test_refusing_a_join_keeps_the_other_joins_working(gate):
    assert gate.refuse_join("k", "task-1")
    assert gate.submit(Submission("k", b"m", start=True, join_id="task-2")) is not None


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
    parked = gate.submit(Submission("busy", b"next"))
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
        gate.submit(Submission("deep", b"m"))
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


def test_a_stopped_run_keeps_its_slot_while_it_renews_and_fails_without_recovery_once_released(make_gate):
    gate = make_gate(lease_seconds=30)
    ticket, token = running(gate, "k", max_lost=3)
    parked = gate.submit(Submission("k", b"next"))

    stopping = gate.stop("k", ticket, 1, by="ops", how="SIGTERM")

    assert stopping is not None and (stopping.by, stopping.how) == ("ops", "SIGTERM")
    assert gate.holds(Lease("k", ticket, token)), "not fenced: a process that outlives the signal keeps its key"
    assert gate.renew([Lease("k", ticket, token)]) == {Lease("k", ticket, token): True}
    assert gate.reap()[1] == [], "the slot stays held until the run has ended: the next task must not overlap"
    assert gate.inspect("k").holders[ticket].stopping == stopping
    # Its worker saw the process end: the release of that dispatch fails it, without a recovery.
    recoveries = gate.release("k", ticket, dispatch=1)
    assert [(r.action, r.ticket, r.stopped) for r in recoveries] == [
        (RecoveryAction.FAIL, ticket, stopping),
        (RecoveryAction.GRANT, parked.ticket, None),
    ]
    assert gate.release("k", ticket, dispatch=1) == [], "a second end of it ends nothing"


def test_a_stopped_run_whose_lease_expires_fails_naming_who_stopped_it(make_gate):
    gate = make_gate(lease_seconds=0.3)
    ticket, _ = running(gate, "k", max_lost=3)
    stopping = gate.stop("k", ticket, 1, by="ops", how="SIGKILL")

    [recovery] = wait_until(lambda: gate.reap()[1], timeout=5, message="the lease to expire")

    assert (recovery.action, recovery.stopped) == (RecoveryAction.FAIL, stopping)
    assert gate.inspect("k").holders == {}


def test_the_first_stop_names_the_run_and_a_kill_by_celery_after_it_keeps_the_operators_name(gate):
    ticket, _ = running(gate, "k")
    first = gate.stop("k", ticket, 1, by="", how="revoked by Celery")
    assert first is not None and first.by == ""
    by_operator = gate.stop("k", ticket, 1, by="ops", how="SIGTERM")
    assert by_operator is not None and by_operator.by == "ops" and by_operator.since_ms == first.since_ms
    assert gate.stop("k", ticket, 1, by="", how="revoked by Celery") == by_operator
    assert gate.stop("k", ticket, 1, by="other", how="SIGKILL") == by_operator, "a second stop changes nothing"


def test_stopping_a_ticket_that_does_not_run_changes_nothing(gate, gate_redis):
    ticket, token = running(gate, "k")
    granted = gate.submit(Submission("other", b"m"))
    before = {name: gate_redis.hgetall(KeyNames(name).holders) for name in ("k", "other")}
    assert gate.stop("k", ticket, 2, by="ops", how="SIGTERM") is None, "another dispatch than the run's"
    assert gate.stop("other", granted.ticket, 1, by="ops", how="SIGTERM") is None, "granted, not started"
    assert gate.stop("k", 999, 1, by="ops", how="SIGTERM") is None
    assert {name: gate_redis.hgetall(KeyNames(name).holders) for name in ("k", "other")} == before
    assert gate.holds(Lease("k", ticket, token))
    assert gate.inspect("k").holders[ticket].stopping is None


def test_a_stop_note_is_read_only_for_its_own_attempt(gate, gate_redis):
    """Notes are kept in meta by ticket; one whose run ended is not read as a later run's (its dispatch
    differs) and goes with the next stop."""
    ticket, token = running(gate, "k", max_lost=3)
    assert gate.stop("k", ticket, 1, by="ops", how="SIGTERM")
    gate_redis.hset(KeyNames("k").meta, "stop:77", "1|5|SIGTERM|ghost")
    gate_redis.hset(KeyNames("k").meta, f"stop:{ticket}", b"9|5|\xff|ghost")
    assert gate.inspect("k").holders[ticket].stopping is None, "a note of another dispatch"
    other, _ = running(gate, "j")
    gate.stop("j", other, 1, by="ops", how="SIGTERM")
    gate.stop("k", ticket, 1, by="ops", how="SIGTERM")
    assert not gate_redis.hexists(KeyNames("k").meta, "stop:77"), "a note of a ticket that holds nothing went"


def test_a_pause_keeps_who_paused_the_key_and_when_until_it_is_resumed(gate, gate_redis):
    before = time.time()
    assert gate.pause("k", by="olga (admin)")
    snapshot = gate.inspect("k")
    assert snapshot.paused and snapshot.paused_by == "olga (admin)"
    assert snapshot.paused_since is not None and before - 1 <= snapshot.paused_since <= time.time() + 1
    assert not gate.pause("k", by="another"), "paused already"
    again = gate.inspect("k")
    assert (again.paused_by, again.paused_since) == ("olga (admin)", snapshot.paused_since), "the first pause kept"
    gate.resume("k")
    assert gate.pause("k", by="x" * 1000)
    assert gate.inspect("k").paused_by == "x" * 200, "kept to 200 characters"
    gate.resume("k")
    resumed = gate.inspect("k")
    assert (resumed.paused, resumed.paused_since, resumed.paused_by) == (False, None, "")
    # Written by someone else: read without failing. (On another key: "k", drained, keeps its counters a
    # millisecond, and fields written onto them would go with them.)
    gate_redis.hset(KeyNames("odd").meta, mapping={"paused": "not a time", "paused_by": b"\xff\xfe"})
    odd = gate.inspect("odd")
    assert (odd.paused, odd.paused_since, odd.paused_by) == (True, None, "\ufffd\ufffd")


def test_waiting_ahead_counts_the_tickets_before_one_in_its_queue(gate):
    ticket, _ = running(gate, "k")
    parked = [gate.submit(Submission("k", f"m{n}".encode())).ticket for n in range(3)]
    assert [gate.waiting_ahead("k", t) for t in parked] == [0, 1, 2]
    assert gate.waiting_ahead("k", ticket) is None, "a holder does not wait"
    assert gate.waiting_ahead("other", 1) is None
