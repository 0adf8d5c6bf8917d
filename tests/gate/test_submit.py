"""submit.lua: every branch (granted, parked, limit > 1, paused key, start=True, join id duplicates, retries)."""

from __future__ import annotations

import time

import pytest
import redis

from django_keyed_queue.gate import Code, Finish, Gate, NotSent, QueueFull, Start, Submission, SubmitResult
from django_keyed_queue.gate.keys import KeyNames
from tests.gate_redis import message_of, redis_names


def test_first_submit_is_granted_and_stores_its_message(gate, gate_redis):
    result = gate.submit(Submission("k", b"m1"))

    assert result == SubmitResult(ticket=1, granted=True, token=0)
    state = gate.inspect("k")
    assert state.last_ticket == 1
    assert state.last_token == 0, "a grant alone takes no fencing token"
    assert state.waiting == []
    assert state.messages == 1
    assert message_of(gate_redis, "k", 1) == b"m1"
    granted = state.holders[1]
    assert granted.state == "granted"
    assert (granted.dispatch, granted.token, granted.attempts) == (1, 0, 0)
    # A granted ticket's deadline is the dispatch timeout (60 s), not the lease (30 s).
    assert 59 < granted.deadline_in <= 60


def test_submit_behind_a_holder_is_parked_in_order(gate, gate_redis):
    gate.submit(Submission("k", b"m1"))

    second = gate.submit(Submission("k", b"m2"))
    third = gate.submit(Submission("k", b"m3"))

    assert second == SubmitResult(ticket=2, granted=False, token=0)
    assert third == SubmitResult(ticket=3, granted=False, token=0)
    state = gate.inspect("k")
    assert list(state.holders) == [1]
    assert state.waiting == [2, 3]
    assert state.messages == 3
    assert message_of(gate_redis, "k", 2) == b"m2"
    assert message_of(gate_redis, "k", 3) == b"m3"


def test_limit_grants_that_many_then_parks(gate):
    results = [gate.submit(Submission("k", f"m{i}".encode(), limit=3)) for i in range(1, 6)]

    assert [r.ticket for r in results] == [1, 2, 3, 4, 5]
    assert [r.granted for r in results] == [True, True, True, False, False]
    state = gate.inspect("k")
    assert sorted(state.holders) == [1, 2, 3]
    assert all(h.state == "granted" for h in state.holders.values())
    assert state.waiting == [4, 5]


def test_a_free_slot_is_not_taken_past_waiting_tickets(gate):
    """FIFO: with tickets parked, a new one parks even if its limit leaves a free slot."""
    gate.submit(Submission("k", b"m1", limit=1))
    gate.submit(Submission("k", b"m2", limit=1))

    third = gate.submit(Submission("k", b"m3", limit=2))

    assert not third.granted
    assert gate.inspect("k").waiting == [2, 3]


def test_keys_are_independent(gate):
    assert gate.submit(Submission("a", b"a1")).granted
    assert gate.submit(Submission("b", b"b1")) == SubmitResult(ticket=1, granted=True, token=0)
    assert not gate.submit(Submission("a", b"a2")).granted


def test_paused_key_parks_every_submission(gate, gate_redis):
    gate_redis.hset(KeyNames("k").meta, "paused", "1")

    first = gate.submit(Submission("k", b"m1", limit=3))
    started = gate.submit(Submission("k", b"m2", limit=3, start=True))

    assert first == SubmitResult(ticket=1, granted=False, token=0)
    assert started == SubmitResult(ticket=2, granted=False, token=0)
    state = gate.inspect("k")
    assert state.paused is True
    assert state.holders == {}
    assert state.waiting == [1, 2]
    assert state.last_token == 0


def test_start_true_grants_and_starts_with_a_token(gate):
    result = gate.submit(Submission("k", b"m1", start=True))

    assert result == SubmitResult(ticket=1, granted=True, token=result.token) and result.token > 0
    state = gate.inspect("k")
    assert state.last_token == result.token
    running = state.holders[1]
    assert running.state == "running"
    assert (running.dispatch, running.token, running.attempts) == (1, result.token, 1)
    # A started ticket's deadline is the lease (30 s).
    assert 29 < running.deadline_in <= 30
    # Its (duplicate) message cannot start it again.
    assert gate.start(Start("k", 1, 1)).code is Code.ALREADY_STARTED
    assert gate.finish(Finish("k", 1, result.token)).ok


def test_start_true_on_a_busy_key_parks_without_a_token(gate):
    gate.submit(Submission("k", b"m1"))

    parked = gate.submit(Submission("k", b"m2", start=True))

    assert parked == SubmitResult(ticket=2, granted=False, token=0)
    assert gate.inspect("k").last_token == 0


def test_duplicate_join_id_returns_none_and_changes_nothing(gate, gate_redis):
    first = gate.submit(Submission("k", b"m1", start=True, join_id="task-1"))
    before = gate.inspect("k")
    names_before = redis_names(gate_redis)

    assert gate.submit(Submission("k", b"again", start=True, join_id="task-1")) is None
    assert gate.submit(Submission("k", b"again", join_id="task-1")) is None

    after = gate.inspect("k")
    assert after.last_ticket == before.last_ticket == first.ticket
    assert after.last_token == before.last_token
    assert after.messages == 1 and after.waiting == []
    assert message_of(gate_redis, "k", first.ticket) == b"m1"
    assert redis_names(gate_redis) == names_before


def test_distinct_join_ids_and_no_join_id_are_not_duplicates(gate):
    assert gate.submit(Submission("k", b"m1", join_id="task-1")).ticket == 1
    assert gate.submit(Submission("k", b"m2", join_id="task-2")).ticket == 2
    assert gate.submit(Submission("k", b"m3")).ticket == 3
    assert gate.submit(Submission("k", b"m4")).ticket == 4, "an empty join id never makes a duplicate"


def test_join_ids_are_remembered_per_key(gate):
    assert gate.submit(Submission("a", b"m", join_id="task-1")) is not None
    assert gate.submit(Submission("b", b"m", join_id="task-1")) is not None
    assert gate.submit(Submission("a", b"m", join_id="task-1")) is None


def test_join_ids_are_kept_for_the_horizon_only(gate_redis, make_gate):
    gate = make_gate(idle_horizon_seconds=3600)
    gate.submit(Submission("k", b"m1", join_id="task-1"))
    joined = KeyNames("k").joined
    assert 3_599_000 < gate_redis.pttl(joined) <= 3_600_000
    # Age the entry past the horizon by hand (no waiting): it is pruned and the id accepted again.
    gate_redis.zadd(joined, {"task-1": 1})

    again = gate.submit(Submission("k", b"m1 again", join_id="task-1"))

    assert again is not None and again.ticket == 2


@pytest.mark.parametrize("message", [b"", b"\x00\xff\x80 binary\r\n", "ünïcode ✓".encode(), bytes(range(256)) * 40])
def test_messages_are_stored_and_handed_back_byte_for_byte(gate, gate_redis, message):
    first = gate.submit(Submission("k", b"holder", start=True))
    parked = gate.submit(Submission("k", message))
    assert message_of(gate_redis, "k", parked.ticket) == message

    done = gate.finish(Finish("k", first.ticket, first.token))

    assert [(g.ticket, g.message) for g in done.granted] == [(parked.ticket, message)]


def test_a_retried_submit_gets_the_ticket_its_message_already_holds(gate):
    granted = gate.submit(Submission("k", b"first", task_id="t1"))
    parked = gate.submit(Submission("k", b"second", task_id="t2"))
    assert gate.submit(Submission("k", b"first", task_id="t1"), retried=True) == granted, (
        "granted, as the lost reply said"
    )
    assert gate.submit(Submission("k", b"second", task_id="t2"), retried=True) == parked, (
        "parked, as the lost reply said"
    )
    assert gate.inspect("k").last_ticket == 2, "no ticket was taken"
    assert gate.inspect("k").waiting == [parked.ticket]


def test_a_retried_submit_whose_first_call_never_ran_takes_a_ticket(gate):
    gate.submit(Submission("k", b"first", task_id="t1"))
    assert gate.submit(Submission("k", b"other", task_id="t2"), retried=True) == SubmitResult(
        ticket=2, granted=False, token=0
    )
    assert gate.submit(Submission("fresh", b"m", task_id="t3"), retried=True) == SubmitResult(
        ticket=1, granted=True, token=0
    )


def test_a_retried_submit_finds_its_ticket_by_task_id_not_by_scanning(gate, gate_redis):
    gate.pause("k")
    for n in range(300):
        gate.submit(Submission("k", b"same message", task_id=f"t{n}"))
    found = gate.submit(Submission("k", b"same message", task_id="t200"), retried=True)
    assert found == SubmitResult(ticket=201, granted=False, token=0), (
        "the ticket of that task id, not the first equal one"
    )
    given_back = gate.submit(Submission("k", b"other message", task_id="t5"), retried=True)
    assert given_back.ticket == 301, "a task id whose ticket holds another message takes a new ticket"


def test_task_ids_are_remembered_for_two_generations_only(gate, gate_redis, monkeypatch):
    monkeypatch.setattr("django_keyed_queue.gate.submit.RECENT_SUBMISSION_SECONDS", 0.2)
    names = KeyNames("k")
    gate.pause("k")
    gate.submit(Submission("k", b"m1", task_id="t1"))
    time.sleep(0.25)
    gate.submit(Submission("k", b"m2", task_id="t2"))  # a new generation: t1 moves to the older one
    assert gate_redis.hgetall(names.recent) == {b"t2": b"2"}
    assert gate_redis.hgetall(names.recent_older) == {b"t1": b"1"}
    assert gate.submit(Submission("k", b"m1", task_id="t1"), retried=True).ticket == 1, "still found"
    time.sleep(0.45)  # both generations expired on their own
    assert not gate_redis.exists(names.recent, names.recent_older)
    assert gate.submit(Submission("k", b"m2", task_id="t2"), retried=True).ticket == 3
    assert gate_redis.pttl(names.recent) <= 400


def test_a_full_queue_refuses_the_submit_and_takes_nothing(gate, gate_redis):
    running = gate.submit(Submission("k", b"m1", start=True, max_waiting=2))
    gate.submit(Submission("k", b"m2", task_id="t2", max_waiting=2))
    gate.submit(Submission("k", b"m3", task_id="t3", max_waiting=2))
    before = {name: gate_redis.dump(name) for name in redis_names(gate_redis)}

    with pytest.raises(QueueFull, match="key 'k' has 2 tasks waiting") as refused:
        gate.submit(Submission("k", b"m4", task_id="t4", max_waiting=2))

    assert refused.value.waiting == 2
    assert {name: gate_redis.dump(name) for name in redis_names(gate_redis)} == before, "nothing written"
    assert gate.submit(Submission("k", b"m4", max_waiting=3)).ticket == 4, "a higher limit takes it"
    gate.finish(Finish("k", running.ticket, running.token))
    assert gate.submit(Submission("k", b"m5", max_waiting=3)).ticket == 5, "a waiting ticket was granted: room again"


def test_a_free_key_grants_even_with_a_tiny_depth_limit(gate):
    assert gate.submit(Submission("k", b"m1", max_waiting=1)).granted
    assert not gate.submit(Submission("k", b"m2", max_waiting=1)).granted
    with pytest.raises(QueueFull):
        gate.submit(Submission("k", b"m3", max_waiting=1))


def test_a_server_that_cannot_be_reached_is_reported_as_not_sent():
    unreachable = Gate(redis.Redis(port=1, socket_connect_timeout=1))
    with pytest.raises(NotSent):
        unreachable.submit(Submission("k", b"m"))
