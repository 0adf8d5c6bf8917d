"""Gate.submit_many: many submissions in one round trip, each as Gate.submit takes it."""

from __future__ import annotations

from django_keyed_queue.gate import QueueFull, Submission
from tests.gate_redis import DEADLINES, UNWRITTEN, index_scores


def test_submissions_take_tickets_in_list_order_per_key(gate):
    results = gate.submit_many(
        [Submission("a", b"a1", "t1"), Submission("b", b"b1", "t2"), Submission("a", b"a2", "t3")]
    )
    assert [(r.ticket, r.granted) for r in results] == [(1, True), (1, True), (2, False)]
    assert gate.inspect("a").waiting == [2]


def test_a_full_key_refuses_its_submission_and_takes_the_others(gate):
    gate.submit(Submission("a", b"held"))
    gate.submit(Submission("a", b"waits"))
    results = gate.submit_many(
        [Submission("a", b"a3", "t1", max_waiting=1), Submission("b", b"b1", "t2", max_waiting=1)]
    )
    assert isinstance(results[0], QueueFull) and results[0].waiting == 1
    assert results[1].granted
    assert gate.inspect("a").last_ticket == 2, "nothing taken for the full key"


def test_keys_are_indexed_for_the_reaper_and_records_for_their_writers(gate, gate_redis):
    gate.submit_many([Submission("a", b"m", "t1", record=b"r"), Submission("b", b"m", "t2")])
    assert set(index_scores(gate_redis, DEADLINES)) == {"a", "b"}
    assert list(index_scores(gate_redis, UNWRITTEN)) == ["a"]
    assert [(u.key, u.record) for u in gate.unwritten(["a", "b"]).records] == [("a", b"r")]


def test_a_batch_sent_again_after_a_lost_reply_takes_no_second_ticket(gate):
    batch = [Submission("a", b"a1", "t1"), Submission("a", b"a2", "t2")]
    first = gate.submit_many(batch)
    again = gate.submit_many([*batch, Submission("a", b"a3", "t3")], retried=True)
    assert [r.ticket for r in again] == [r.ticket for r in first] + [3]


def test_an_empty_batch_sends_nothing(gate, gate_redis):
    assert gate.submit_many([]) == []
    assert gate_redis.dbsize() == 0
