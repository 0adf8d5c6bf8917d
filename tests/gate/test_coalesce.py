"""submit.lua's coalescing: a ticket that must wait replaces the one of the same task waiting."""

from __future__ import annotations

import json
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_keyed_queue.gate import Code, Finish, QueueFull, Start, Submission
from django_keyed_queue.gate.keys import KeyNames
from tests.gate_redis import message_of


def stored(task: str, task_id: str) -> bytes:
    """A stored message as ``TaskMessage.encode`` makes its envelope (the gate reads only task and id)."""
    return json.dumps({"task": task, "id": task_id, "content_type": "application/json", "body": ""}).encode()


def record(task_id: str) -> bytes:
    return json.dumps({"task_id": task_id, "task_name": "t", "arguments": f"args=({task_id!r},)"}).encode()


def submit(gate, key: str, task_id: str, task: str = "t", *, coalesce: bool = True, **options):
    return gate.submit(
        Submission(
            key,
            stored(task, task_id),
            task_id=task_id,
            record=record(task_id),
            coalesce=task if coalesce else "",
            **options,
        )
    )


def test_a_waiting_ticket_is_replaced_by_the_next_and_the_running_one_is_not(gate, gate_redis):
    running = submit(gate, "k", "t0")
    first = submit(gate, "k", "t1")
    assert running.granted and not first.granted and first.superseded is None

    results = [submit(gate, "k", f"t{i}") for i in range(2, 6)]

    tickets = [first.ticket, *(r.ticket for r in results)]
    assert [r.superseded for r in results] == [(tickets[i], f"t{i + 1}") for i in range(4)]
    state = gate.inspect("k")
    assert state.waiting == [results[-1].ticket], "one waits: the latest"
    assert list(state.holders) == [running.ticket], "the running one is not touched"
    for replaced in (first, *results[:-1]):
        assert message_of(gate_redis, "k", replaced.ticket) is None


def test_the_replaced_tickets_records_are_kept_as_superseded_by_their_replacement(gate):
    submit(gate, "k", "t0")
    first = submit(gate, "k", "t1")
    second = submit(gate, "k", "t2")

    kept = {(u.ticket, u.superseded): u for u in gate.unwritten(["k"]).records}

    assert kept[second.ticket, False].granted is False and (second.ticket, True) not in kept
    assert not kept[first.ticket, False].superseded, "its own record stays, for a writer that read it"
    replaced = kept[first.ticket, True]
    assert replaced.superseded and not replaced.granted and replaced.field == f"{first.ticket}s"
    data = json.loads(replaced.record)
    assert data["task_id"] == "t1" and data["superseded_by"] == "t2"
    assert data["arguments"] == "args=('t1',)", "the producer's record, kept"
    assert int(data["enqueued_ms"]) <= replaced.at_ms


def test_a_replaced_ticket_whose_row_is_written_keeps_what_finds_its_row(gate):
    submit(gate, "k", "t0")
    first = submit(gate, "k", "t1")
    gate.forget_unwritten(gate.unwritten(["k"]).records)  # both rows written

    submit(gate, "k", "t2")

    [replaced] = [u for u in gate.unwritten(["k"]).records if u.superseded]
    data = json.loads(replaced.record)
    assert replaced.ticket == first.ticket
    assert (data["task_id"], data["task_name"], data["superseded_by"]) == ("t1", "t", "t2")
    assert "enqueued_ms" not in data


def test_a_granted_ticket_is_not_replaced(gate):
    """Limit 2: two are granted; the third waits; only waiting tickets are ever replaced."""
    granted = [submit(gate, "k", f"t{i}", limit=2) for i in range(2)]
    waiting = submit(gate, "k", "t2", limit=2)
    latest = submit(gate, "k", "t3", limit=2)

    assert all(g.granted for g in granted)
    assert latest.superseded == (waiting.ticket, "t2")
    state = gate.inspect("k")
    assert set(state.holders) == {g.ticket for g in granted} and state.waiting == [latest.ticket]


def test_another_tasks_waiting_ticket_is_not_replaced_and_order_is_submission_order(gate):
    submit(gate, "k", "a0", "a")
    a1 = submit(gate, "k", "a1", "a")
    b1 = submit(gate, "k", "b1", "b")
    a2 = submit(gate, "k", "a2", "a")
    b2 = submit(gate, "k", "b2", "b", coalesce=False)

    assert a2.superseded == (a1.ticket, "a1") and b2.superseded is None
    assert gate.inspect("k").waiting == [b1.ticket, a2.ticket, b2.ticket]


def test_a_task_that_does_not_coalesce_replaces_nothing(gate):
    submit(gate, "k", "t0")
    first = submit(gate, "k", "t1")
    second = submit(gate, "k", "t2", coalesce=False)

    assert second.superseded is None
    assert gate.inspect("k").waiting == [first.ticket, second.ticket]


def test_a_stored_message_not_as_submit_stores_it_is_left_waiting(gate, gate_redis):
    submit(gate, "k", "t0")
    first = submit(gate, "k", "t1")
    gate_redis.hset(KeyNames("k").messages, first.ticket, b"\x00not json{")

    second = submit(gate, "k", "t2")

    assert second.superseded is None
    assert gate.inspect("k").waiting == [first.ticket, second.ticket]


def test_coalescing_at_max_waiting_replaces_instead_of_refusing(gate):
    submit(gate, "k", "t0", max_waiting=1)
    submit(gate, "k", "t1", max_waiting=1)

    latest = submit(gate, "k", "t2", max_waiting=1)

    assert latest.superseded is not None and gate.inspect("k").waiting == [latest.ticket]
    with pytest.raises(QueueFull):  # a task that does not coalesce is still refused
        submit(gate, "k", "x", "other", coalesce=False, max_waiting=1)


def test_a_paused_keys_waiting_ticket_is_replaced_too(gate):
    gate.pause("k")
    first = submit(gate, "k", "t1")
    second = submit(gate, "k", "t2")

    assert second.superseded == (first.ticket, "t1")
    assert gate.inspect("k").waiting == [second.ticket]


def test_submit_many_coalesces_within_one_batch(gate):
    subs = [Submission("k", stored("t", f"t{i}"), f"t{i}", record=record(f"t{i}"), coalesce="t") for i in range(4)]
    results = gate.submit_many(subs)

    assert results[0].granted
    assert [r.superseded for r in results[1:]] == [None, (results[1].ticket, "t1"), (results[2].ticket, "t2")]
    assert gate.inspect("k").waiting == [results[3].ticket]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(task=st.text(min_size=1, max_size=300), task_id=st.text(min_size=1, max_size=300))
def test_any_task_name_and_id_coalesce_and_come_back_whole(gate, task, task_id):
    key = f"k{uuid.uuid4()}"
    submit(gate, key, "first", task)
    submit(gate, key, task_id, task)

    latest = submit(gate, key, "latest", task)

    assert latest.superseded is not None and latest.superseded[1] == task_id
    [replaced] = [u for u in gate.unwritten([key]).records if u.superseded]
    data = json.loads(replaced.record)
    assert (data["task_id"], data["superseded_by"]) == (task_id, "latest")


# --- newer_waiting: what a running task's superseded() reads ------------------------------------------


def test_a_run_learns_a_newer_submission_of_its_task_waits(gate):
    running = submit(gate, "k", "t0")
    assert not gate.newer_waiting("k", "t", running.ticket)

    newer = submit(gate, "k", "t1")

    assert gate.newer_waiting("k", "t", running.ticket)
    assert not gate.newer_waiting("k", "t", newer.ticket), "not newer than itself"
    assert not gate.newer_waiting("k", "other", running.ticket), "another task's"
    assert not gate.newer_waiting("other-key", "t", running.ticket)


def test_a_granted_newer_ticket_no_longer_waits(gate):
    running = gate.submit(Submission("k", stored("t", "t0"), task_id="t0", coalesce="t", start=True))
    newer = submit(gate, "k", "t1")

    finished = gate.finish(Finish("k", running.ticket, running.token))

    assert [g.ticket for g in finished.granted] == [newer.ticket]
    assert not gate.newer_waiting("k", "t", running.ticket)


def test_a_newer_submission_that_does_not_coalesce_is_not_one(gate):
    running = submit(gate, "k", "t0")
    submit(gate, "k", "t1", coalesce=False)

    assert not gate.newer_waiting("k", "t", running.ticket)


def test_a_pointer_not_as_submit_writes_it_reads_as_none_waiting(gate, gate_redis):
    running = submit(gate, "k", "t0")
    gate_redis.hset(KeyNames("k").meta, "coalesce:t", "not a ticket")

    assert not gate.newer_waiting("k", "t", running.ticket)


# --- replacement: the chain a lookup follows while the rows are not written ----------------------------------


def test_the_chain_of_replacements_is_followed_to_its_end_from_any_task(gate):
    submit(gate, "k", "t0")  # holds the key
    tickets = {task_id: submit(gate, "k", task_id).ticket for task_id in ("t1", "t2", "t3", "t4")}

    assert gate.replacement("k", "t1", max_hops=10) == ("t4", 3)
    assert gate.replacement("k", "t2", ticket=tickets["t2"], max_hops=10) == ("t4", 2), "from the ticket the row has"
    assert gate.replacement("k", "t4", max_hops=10) == ("t4", 0), "the one waiting"
    assert gate.replacement("k", "t0", max_hops=10) == ("t0", 0), "the one that runs"
    assert gate.replacement("k", "t1", max_hops=2) == ("t3", 2), "at most max_hops"
    assert gate.replacement("k", "unknown", max_hops=10) == ("unknown", 0)
    assert gate.replacement("other-key", "t1", max_hops=10) == ("t1", 0)


def test_a_written_record_is_no_longer_followed_and_a_ticket_of_another_task_never_is(gate, gate_redis):
    submit(gate, "k", "t0")
    first = submit(gate, "k", "t1")
    submit(gate, "k", "t2")
    submit(gate, "k", "t3")

    assert gate.replacement("k", "t1", ticket=first.ticket + 1, max_hops=10) == ("t3", 2), (
        "a ticket not its own (tickets start over) is passed by: found among the recent submissions"
    )
    written = [u for u in gate.unwritten(["k"]).records if u.superseded and u.ticket == first.ticket]
    gate.forget_unwritten(written)  # its row is written: the rows tell the rest
    assert gate.replacement("k", "t1", max_hops=10) == ("t1", 0)
    assert gate.replacement("k", "t2", max_hops=10) == ("t3", 1)


def test_records_not_as_supersede_keeps_them_end_the_chain(gate, gate_redis):
    submit(gate, "k", "t0")
    first = submit(gate, "k", "t1")
    submit(gate, "k", "t2")
    field = f"{first.ticket}s"
    for kept in (b"s|1|not json", b"w|1|{}", b's|1|{"task_id": "t1"}', b's|1|{"task_id": "t1", "superseded_by": 7}'):
        gate_redis.hset(KeyNames("k").unwritten, field, kept)
        assert gate.replacement("k", "t1", max_hops=10) == ("t1", 0), kept


# --- debounce: a granted ticket not started yet is replaced too ------------------------------------------


def debounced(gate, key: str, task_id: str, debounce_ms: int = 1500):
    submission = Submission(
        key, stored("t", task_id), task_id=task_id, record=record(task_id), coalesce="t", debounce_ms=debounce_ms
    )
    return gate.submit(submission)


def test_debounce_replaces_the_granted_ticket_not_started_and_its_message_is_refused_when_due(gate):
    first = debounced(gate, "k", "t0")
    second = debounced(gate, "k", "t1")

    assert first.granted and second.granted
    assert second.superseded == (first.ticket, "t0")
    state = gate.inspect("k")
    assert list(state.holders) == [second.ticket] and state.waiting == []
    assert 60 + 1.4 < state.holders[second.ticket].deadline_in <= 60 + 1.5, "its dispatch deadline runs from the eta"
    assert gate.start(Start("k", first.ticket, 1)).code is Code.NOT_GRANTED, "the replaced one's message is dropped"
    assert gate.start(Start("k", second.ticket, 1)).ok


def test_debounce_never_replaces_a_running_ticket(gate):
    running = debounced(gate, "k", "t0")
    gate.start(Start("k", running.ticket, 1))

    waiting = debounced(gate, "k", "t1")
    latest = debounced(gate, "k", "t2")

    assert not waiting.granted and waiting.superseded is None
    assert latest.superseded == (waiting.ticket, "t1")
    state = gate.inspect("k")
    assert state.holders[running.ticket].state == "running" and state.waiting == [latest.ticket]


def test_without_debounce_a_granted_ticket_is_not_replaced(gate):
    granted = submit(gate, "k", "t0")
    parked = submit(gate, "k", "t1")

    assert parked.superseded is None and not parked.granted
    assert list(gate.inspect("k").holders) == [granted.ticket]


def test_debounce_does_not_replace_a_granted_ticket_another_tasks_ticket_waits_behind(gate):
    """Its slot would be freed with the other task's ticket first in the queue, and nothing would grant it:
    the granted one runs at its eta, and the newer one waits behind the other task's."""
    granted = debounced(gate, "k", "t0")
    other = gate.submit(Submission("k", stored("other", "o0"), task_id="o0"))
    newer = debounced(gate, "k", "t1")

    assert granted.granted and not other.granted
    assert newer.superseded is None and not newer.granted
    state = gate.inspect("k")
    assert list(state.holders) == [granted.ticket] and state.waiting == [other.ticket, newer.ticket]


def test_debounce_on_a_shared_key_replaces_only_its_own_tasks_ticket(gate):
    other = gate.submit(Submission("k", stored("other", "o0"), task_id="o0"))  # another task holds the key's slot
    first = debounced(gate, "k", "t0")
    second = debounced(gate, "k", "t1")

    assert other.granted and not first.granted
    assert second.superseded == (first.ticket, "t0") and not second.granted
    assert gate.inspect("k").waiting == [second.ticket]


def test_a_writer_that_read_the_replaced_tickets_record_first_does_not_delete_its_superseded_record(gate):
    """The writer reads a waiting ticket's record, a coalescing submission replaces the ticket, then the
    writer deletes what it read: the superseded record is kept apart, for the next pass."""
    submit(gate, "k", "t0")
    first = submit(gate, "k", "t1")
    read = gate.unwritten(["k"]).records

    submit(gate, "k", "t2")
    gate.forget_unwritten(read)

    left = gate.unwritten(["k"]).records
    [replaced] = [u for u in left if u.ticket == first.ticket]
    assert replaced.superseded and json.loads(replaced.record)["superseded_by"] == "t2"
    gate.forget_unwritten(left)
    assert gate.unwritten(["k"]).records == []


def test_a_field_not_as_submit_writes_it_is_handed_on_to_be_refused(gate, gate_redis):
    gate_redis.hset(KeyNames("k").unwritten, "not-a-ticket", b'{"task_id": "x", "task_name": "t", "arguments": ""}')

    [odd] = gate.unwritten(["k"]).records

    assert (odd.ticket, odd.record, odd.field) == (0, b"", "not-a-ticket")
    gate.forget_unwritten([odd])
    assert not gate_redis.exists(KeyNames("k").unwritten)
