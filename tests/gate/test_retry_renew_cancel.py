"""retry.lua, renew.lua and cancel.lua: every return code and what each leaves in Redis."""

from __future__ import annotations

from django_keyed_queue.gate import Cancel, Code, Finish, Grant, Lease, Start, Submission
from django_keyed_queue.gate.keys import KeyNames
from tests.gate_redis import holder, message_of, redis_names

# --- retry ---------------------------------------------------------------------------------


def test_retry_keeps_the_slot_and_issues_a_new_dispatch(gate, gate_redis):
    first = gate.submit(Submission("k", b"m1", start=True))
    gate.submit(Submission("k", b"m2"))

    dispatch = gate.retry(Lease("k", first.ticket, first.token), b"m1 retry", countdown_seconds=10)

    assert dispatch == 2
    retrying = holder(gate, "k", first.ticket)
    assert retrying.state == "granted"
    assert (retrying.dispatch, retrying.token, retrying.attempts) == (2, 0, 1)
    # Deadline: the countdown (10 s) plus the dispatch timeout (60 s).
    assert 69 < retrying.deadline_in <= 70
    assert message_of(gate_redis, "k", first.ticket) == b"m1 retry"
    state = gate.inspect("k")
    assert state.waiting == [2], "the key stays held: the next ticket is not granted"
    assert gate.start(Start("k", 2, 1)).code is Code.NOT_GRANTED
    assert not gate.submit(Submission("k", b"m3")).granted


def test_after_a_retry_only_the_new_dispatch_starts_the_ticket(gate):
    first = gate.submit(Submission("k", b"m1", start=True))
    gate.submit(Submission("k", b"m2"))
    dispatch = gate.retry(Lease("k", first.ticket, first.token), b"m1 retry", countdown_seconds=0)

    assert gate.start(Start("k", first.ticket, 1)).code is Code.STALE_DISPATCH
    restarted = gate.start(Start("k", first.ticket, dispatch))
    assert restarted.ok
    assert restarted.token > first.token
    assert restarted.attempts == 2
    assert gate.start(Start("k", first.ticket, 1)).code is Code.STALE_DISPATCH
    assert gate.start(Start("k", first.ticket, dispatch)).code is Code.ALREADY_STARTED

    # The attempt before the retry is fenced everywhere.
    assert gate.finish(Finish("k", first.ticket, first.token)).code is Code.STALE_TOKEN
    assert gate.retry(Lease("k", first.ticket, first.token), b"x", countdown_seconds=0) is None
    assert gate.renew([Lease("k", first.ticket, first.token)]) == {Lease("k", first.ticket, first.token): False}

    done = gate.finish(Finish("k", first.ticket, restarted.token))
    assert done.granted == [Grant("k", 2, 1, b"m2")]


def test_a_requeued_ticket_keeps_its_slot_and_its_message_may_start_it_again(gate, gate_redis):
    first = gate.submit(Submission("k", b"m1", start=True))
    gate.submit(Submission("k", b"m2"))

    assert gate.requeue(Lease("k", first.ticket, first.token))

    requeued = holder(gate, "k", first.ticket)
    assert (requeued.state, requeued.dispatch, requeued.token) == ("granted", 1, 0)
    assert 59 < requeued.deadline_in <= 60  # not redelivered within the dispatch timeout: published again
    assert message_of(gate_redis, "k", first.ticket) == b"m1"
    assert gate.inspect("k").waiting == [2], "the key stays held"
    # The old attempt is fenced; the same message (dispatch 1) starts the ticket again, once.
    assert gate.finish(Finish("k", first.ticket, first.token)).code is Code.STALE_TOKEN
    assert not gate.requeue(Lease("k", first.ticket, first.token))
    again = gate.start(Start("k", first.ticket, 1))
    assert again.ok and again.token > first.token and again.attempts == 2
    assert gate.start(Start("k", first.ticket, 1)).code is Code.ALREADY_STARTED
    assert gate.finish(Finish("k", first.ticket, again.token)).granted == [Grant("k", 2, 1, b"m2")]


def test_retry_with_no_countdown_waits_the_dispatch_timeout(gate):
    first = gate.submit(Submission("k", b"m1", start=True))

    gate.retry(Lease("k", first.ticket, first.token), b"m1", countdown_seconds=0)

    assert 59 < holder(gate, "k", first.ticket).deadline_in <= 60


def test_retry_with_a_wrong_token_is_stale_and_changes_nothing(gate, gate_redis):
    first = gate.submit(Submission("k", b"m1", start=True))

    assert gate.retry(Lease("k", first.ticket, first.token + 1), b"new", countdown_seconds=1) is None
    assert gate.retry(Lease("k", first.ticket, 0), b"new", countdown_seconds=1) is None

    running = holder(gate, "k", first.ticket)
    assert (running.state, running.token, running.dispatch) == ("running", first.token, 1)
    assert message_of(gate_redis, "k", first.ticket) == b"m1"


def test_retry_of_a_ticket_not_running_is_stale(gate, gate_redis):
    granted = gate.submit(Submission("k", b"m1"))
    assert gate.retry(Lease("k", granted.ticket, 0), b"new", countdown_seconds=1) is None
    assert holder(gate, "k", granted.ticket).dispatch == 1
    assert message_of(gate_redis, "k", granted.ticket) == b"m1"

    assert gate.retry(Lease("k", 77, 1), b"new", countdown_seconds=1) is None
    assert gate.retry(Lease("unknown", 1, 1), b"new", countdown_seconds=1) is None


def test_retry_twice_with_the_same_token_is_stale_the_second_time(gate):
    first = gate.submit(Submission("k", b"m1", start=True))

    assert gate.retry(Lease("k", first.ticket, first.token), b"r1", countdown_seconds=0) == 2
    assert gate.retry(Lease("k", first.ticket, first.token), b"r2", countdown_seconds=0) is None
    assert holder(gate, "k", first.ticket).dispatch == 2


# --- renew ---------------------------------------------------------------------------------


def test_renew_moves_the_deadline_to_now_plus_the_lease(gate, make_gate):
    first = gate.submit(Submission("k", b"m1", start=True))
    lease = Lease("k", first.ticket, first.token)
    assert 29 < holder(gate, "k", first.ticket).deadline_in <= 30

    assert make_gate(lease_seconds=100).renew([lease]) == {lease: True}
    assert 99 < holder(gate, "k", first.ticket).deadline_in <= 100

    assert make_gate(lease_seconds=5).renew([lease]) == {lease: True}
    assert 4 < holder(gate, "k", first.ticket).deadline_in <= 5
    running = holder(gate, "k", first.ticket)
    assert (running.state, running.token, running.attempts) == ("running", first.token, 1)


def test_renew_of_many_leases_on_many_keys_reports_each(gate, make_gate):
    a1 = gate.submit(Submission("a", b"m", limit=2, start=True))
    a2 = gate.submit(Submission("a", b"m", limit=2, start=True))
    a3 = gate.submit(Submission("a", b"m", limit=3))  # granted, not started
    b1 = gate.submit(Submission("b", b"m", start=True))
    c1 = gate.submit(Submission("c", b"m", start=True))
    gate.finish(Finish("c", c1.ticket, c1.token))
    leases = {
        Lease("a", a1.ticket, a1.token): True,
        Lease("a", a2.ticket, a2.token): True,
        Lease("a", a3.ticket, 0): False,
        Lease("b", b1.ticket, b1.token + 1): False,  # fenced: wrong token
        Lease("c", c1.ticket, c1.token): False,  # finished
        Lease("nowhere", 1, 1): False,  # unknown key
    }

    outcome = make_gate(lease_seconds=100).renew(leases)

    assert outcome == leases
    assert 99 < holder(gate, "a", a1.ticket).deadline_in <= 100
    assert 99 < holder(gate, "a", a2.ticket).deadline_in <= 100
    assert holder(gate, "a", a3.ticket).deadline_in <= 60, "a lost lease is not extended"
    assert holder(gate, "b", b1.ticket).deadline_in <= 30, "a lost lease is not extended"
    assert not any("nowhere" in name for name in redis_names(gate.client)), "renew must not create keys"


def test_renew_of_nothing_returns_nothing(gate):
    assert gate.renew([]) == {}


def test_renew_after_finish_reports_the_lease_lost(gate):
    first = gate.submit(Submission("k", b"m1", start=True))
    lease = Lease("k", first.ticket, first.token)
    assert gate.renew([lease]) == {lease: True}

    gate.finish(Finish("k", first.ticket, first.token))

    assert gate.renew([lease]) == {lease: False}


# --- cancel --------------------------------------------------------------------------------


def test_cancel_of_a_parked_ticket_removes_it_from_the_queue(gate, gate_redis):
    gate.submit(Submission("k", b"m1"))
    gate.submit(Submission("k", b"m2"))
    gate.submit(Submission("k", b"m3"))

    result = gate.cancel(Cancel("k", 2))

    assert result.ok and result.granted == []
    state = gate.inspect("k")
    assert state.waiting == [3]
    assert list(state.holders) == [1]
    assert message_of(gate_redis, "k", 2) is None
    assert state.messages == 2
    assert gate.start(Start("k", 2, 1)).code is Code.NOT_GRANTED


def test_cancel_of_a_granted_ticket_grants_the_next(gate, gate_redis):
    gate.submit(Submission("k", b"m1"))
    gate.submit(Submission("k", b"m2"))
    gate.submit(Submission("k", b"m3"))

    result = gate.cancel(Cancel("k", 1))

    assert result.ok
    assert result.granted == [Grant("k", 2, 1, b"m2")]
    state = gate.inspect("k")
    assert list(state.holders) == [2] and state.holders[2].state == "granted"
    assert state.waiting == [3]
    assert message_of(gate_redis, "k", 1) is None
    assert gate.start(Start("k", 1, 1)).code is Code.NOT_GRANTED, "the cancelled ticket's message must be dropped"


def test_cancel_of_a_granted_ticket_grants_up_to_the_limit(gate):
    for n in range(1, 6):
        gate.submit(Submission("k", f"m{n}".encode(), limit=2))

    result = gate.cancel(Cancel("k", 1, limit=2))

    assert [g.ticket for g in result.granted] == [3]
    assert sorted(gate.inspect("k").holders) == [2, 3]
    assert gate.inspect("k").waiting == [4, 5]


def test_cancel_of_a_granted_ticket_on_a_paused_key_grants_nothing(gate, gate_redis):
    gate.submit(Submission("k", b"m1"))
    gate.submit(Submission("k", b"m2"))
    gate_redis.hset(KeyNames("k").meta, "paused", "1")

    result = gate.cancel(Cancel("k", 1))

    assert result.ok and result.granted == []
    assert gate.inspect("k").holders == {}
    assert gate.inspect("k").waiting == [2]


def test_cancel_of_a_running_ticket_changes_nothing(gate, gate_redis):
    first = gate.submit(Submission("k", b"m1", start=True))
    gate.submit(Submission("k", b"m2"))
    before = gate.inspect("k")

    result = gate.cancel(Cancel("k", first.ticket))

    assert result.code is Code.RUNNING and result.granted == []
    after = gate.inspect("k")
    assert after.waiting == before.waiting == [2]
    assert after.messages == 2
    assert (after.holders[1].state, after.holders[1].token) == ("running", first.token)
    assert message_of(gate_redis, "k", first.ticket) == b"m1"
    assert gate.finish(Finish("k", first.ticket, first.token)).ok


def test_cancel_of_an_unknown_ticket_is_not_granted(gate):
    first = gate.submit(Submission("k", b"m1", start=True))
    gate.submit(Submission("k", b"m2"))

    assert gate.cancel(Cancel("k", 99)).code is Code.NOT_GRANTED
    assert gate.cancel(Cancel("unknown", 1)).code is Code.NOT_GRANTED
    gate.finish(Finish("k", first.ticket, first.token))
    assert gate.cancel(Cancel("k", first.ticket)).code is Code.NOT_GRANTED, "a finished ticket cannot be cancelled"
    assert gate.cancel(Cancel("k", 2)).ok
    twice = gate.cancel(Cancel("k", 2))
    assert twice.code is Code.NOT_GRANTED and twice.granted == []


# --- cancel with forget=True (a submission that failed before its ticket was seen) ---------


def test_forget_of_the_only_ticket_of_a_new_key_leaves_nothing(gate, gate_redis):
    submitted = gate.submit(Submission("k", b"m1"))

    result = gate.cancel(Cancel("k", submitted.ticket, forget=True))

    assert result.ok and result.granted == []
    assert redis_names(gate_redis) == set(), "the key must be as if never submitted"
    assert gate.submit(Submission("k", b"m2")).ticket == 1


def test_forget_of_the_last_parked_ticket_gives_its_number_back(gate, gate_redis):
    first = gate.submit(Submission("k", b"m1", start=True))
    parked = gate.submit(Submission("k", b"m2"))

    result = gate.cancel(Cancel("k", parked.ticket, forget=True))

    assert result.ok and result.granted == []
    state = gate.inspect("k")
    assert (state.last_ticket, state.waiting, state.messages) == (1, [], 1)
    assert state.idle_expires_in is None, "the key is still held"
    again = gate.submit(Submission("k", b"m2 again"))
    assert (again.ticket, again.granted) == (parked.ticket, False)
    assert message_of(gate_redis, "k", again.ticket) == b"m2 again"
    assert gate.finish(Finish("k", first.ticket, first.token)).granted == [Grant("k", 2, 1, b"m2 again")]


def test_forget_of_a_ticket_that_is_not_the_last_keeps_the_numbering(gate):
    gate.submit(Submission("k", b"m1"))
    middle = gate.submit(Submission("k", b"m2"))
    gate.submit(Submission("k", b"m3"))

    assert gate.cancel(Cancel("k", middle.ticket, forget=True)).ok

    state = gate.inspect("k")
    assert (state.last_ticket, state.waiting) == (3, [3])
    assert gate.submit(Submission("k", b"m4")).ticket == 4


def test_forget_of_a_granted_last_ticket_grants_nothing_else_and_keeps_the_counters(gate, gate_redis):
    first = gate.submit(Submission("k", b"m1", start=True, task_id="t1"))
    gate.finish(Finish("k", first.ticket, first.token))
    submitted = gate.submit(Submission("k", b"m2", task_id="t2"))

    assert gate.cancel(Cancel("k", submitted.ticket, forget=True)).ok

    # The counters stay while the key's recent submissions are remembered: only the meta hash remains.
    assert redis_names(gate_redis) - {KeyNames("k").recent} == {KeyNames("k").meta}
    assert 0 < gate_redis.pttl(KeyNames("k").meta) <= 60_000
    state = gate.inspect("k")
    assert (state.last_ticket, state.last_token) == (1, first.token)
    again = gate.submit(Submission("k", b"m3", start=True, task_id="t3"))
    assert (again.ticket, again.token) == (2, first.token + 1)


def test_cancel_without_forget_never_gives_a_number_back(gate, gate_redis):
    # A task id makes the drained key keep its counters while its submissions are remembered; without one
    # they may expire a millisecond after the cancel, and the second submit would race it (it lost once,
    # on the cluster under load).
    submitted = gate.submit(Submission("k", b"m1", task_id="t1"))

    gate.cancel(Cancel("k", submitted.ticket))

    names = KeyNames("k")
    assert redis_names(gate_redis) == {names.meta, names.recent}, "its counters and the task ids it saw, nothing else"
    assert gate.submit(Submission("k", b"m2", task_id="t2")).ticket == 2


def test_forget_of_a_running_or_unknown_ticket_changes_nothing(gate):
    # A task id makes the drained key keep its counters while its submissions are remembered;
    # without one they may expire a millisecond after the finish, and the check below would race it.
    first = gate.submit(Submission("k", b"m1", start=True, task_id="t1"))

    assert gate.cancel(Cancel("k", first.ticket, forget=True)).code is Code.RUNNING
    assert gate.cancel(Cancel("k", 5, forget=True)).code is Code.NOT_GRANTED
    assert gate.inspect("k").last_ticket == 1
    assert gate.finish(Finish("k", first.ticket, first.token)).ok
    assert gate.cancel(Cancel("k", first.ticket, forget=True)).code is Code.NOT_GRANTED
    assert gate.inspect("k").last_ticket == 1, "a finished ticket's number is never given back"
