"""Submission records kept with their tickets until their rows are written: submit, claim, read, forget."""

from __future__ import annotations

import time

from django_keyed_queue.gate import Cancel, Finish, RecoveryAction, Start, Submission
from django_keyed_queue.gate.keys import KeyNames
from tests.gate_redis import UNWRITTEN, index_scores


def _index(client) -> dict[str, float]:
    return index_scores(client, UNWRITTEN)


def _due_now(gate, client) -> set[str]:
    """The keys of the unwritten index due by now (a key's score is when its first record is due)."""
    now = gate._server_time_ms() + 1000  # scored on this host's clock, the same machine's here
    return {key for key, score in _index(client).items() if score <= now}


def test_a_submission_keeps_its_record_with_its_ticket_and_indexes_its_key(gate, gate_redis):
    granted = gate.submit(Submission("k", b"m1", record=b"r1"))
    parked = gate.submit(Submission("k", b"m2", record=b"r2"))
    gate.submit(Submission("other", b"m3"))  # no record: not indexed

    assert set(_index(gate_redis)) == _due_now(gate, gate_redis) == {"k"}, "due at once without a record delay"
    kept = {u.ticket: u for u in gate.unwritten(["k"]).records}
    assert set(kept) == {granted.ticket, parked.ticket}
    assert (kept[granted.ticket].granted, kept[granted.ticket].record, kept[granted.ticket].message) == (
        True,
        b"r1",
        b"m1",
    )
    assert (kept[parked.ticket].granted, kept[parked.ticket].record, kept[parked.ticket].message) == (
        False,
        b"r2",
        b"m2",
    )
    server_ms = gate._server_time_ms()
    assert all(server_ms - 5000 < u.at_ms <= server_ms for u in kept.values())


def test_a_record_reads_back_without_its_message_once_the_ticket_finished(gate):
    submitted = gate.submit(Submission("k", b"m1", record=b"r1"))
    started = gate.start(Start("k", submitted.ticket, 1))
    gate.finish(Finish("k", submitted.ticket, started.token))

    [kept] = gate.unwritten(["k"]).records
    assert (kept.ticket, kept.record, kept.message) == (submitted.ticket, b"r1", None)


def test_claims_are_exclusive_until_released_or_lapsed(gate, gate_redis):
    gate.submit(Submission("a", b"m", record=b"r"))
    gate.submit(Submission("b", b"m", record=b"r"))

    claims = gate.claim_unwritten(claim_seconds=30, batch=10)
    assert sorted(k for k, _ in claims) == ["a", "b"]
    assert gate.claim_unwritten(claim_seconds=30, batch=10) == [], "a claimed key is passed by"

    gate.forget_unwritten(gate.unwritten(["a", "b"]).records, claims)
    assert _index(gate_redis) == {}
    assert gate.unwritten(["a", "b"]).records == []
    assert gate_redis.exists(KeyNames("a").unwritten, KeyNames("b").unwritten) == 0

    gate.submit(Submission("c", b"m", record=b"r"))
    [(key, _)] = gate.claim_unwritten(claim_seconds=0.05, batch=10)
    time.sleep(0.1)
    assert [k for k, _ in gate.claim_unwritten(claim_seconds=30, batch=10)] == [key], "a lapsed claim is taken over"


def test_a_submission_during_a_claim_keeps_its_key_indexed(gate, gate_redis):
    gate.submit(Submission("k", b"m1", record=b"r1"))
    claims = gate.claim_unwritten(claim_seconds=30, batch=10)
    read = gate.unwritten(["k"]).records
    late = gate.submit(Submission("k", b"m2", record=b"r2"))  # after the writer read, before it forgets

    gate.forget_unwritten(read, claims)

    assert _due_now(gate, gate_redis) == {"k"}, "the late record must stay findable"
    assert [u.ticket for u in gate.unwritten(["k"]).records] == [late.ticket]


def test_batch_bounds_a_claim(gate):
    # On one server, 2 keys; on a cluster, 2 keys of each shard (a share of the batch).
    shards = gate.unwritten_index.names
    keys = [f"k{i}" for i in range(100 * len(shards)) if gate.unwritten_index.shard_of(f"k{i}") == shards[0]][:3]
    for key in keys:
        gate.submit(Submission(key, b"m", record=b"r"))
    batch = 2 * len(shards)
    assert len(gate.claim_unwritten(claim_seconds=30, batch=batch)) == 2
    assert len(gate.claim_unwritten(claim_seconds=30, batch=batch)) == 1


def test_a_failed_submission_s_cancel_drops_its_record_and_an_operator_s_keeps_it(gate):
    failed = gate.submit(Submission("k", b"m1", record=b"r1"))
    cancelled = gate.submit(Submission("k", b"m2", record=b"r2"))

    assert gate.cancel(Cancel("k", failed.ticket, failed=True)).ok
    assert gate.cancel(Cancel("k", cancelled.ticket)).ok

    assert [u.ticket for u in gate.unwritten(["k"]).records] == [cancelled.ticket]


def test_a_retried_submission_keeps_one_record(gate):
    first = gate.submit(Submission("k", b"m1", task_id="t1", record=b"r1"))
    again = gate.submit(Submission("k", b"m1", task_id="t1", record=b"r1"), retried=True)

    assert again.ticket == first.ticket
    assert [(u.ticket, u.record) for u in gate.unwritten(["k"]).records] == [(first.ticket, b"r1")]


def test_an_unclaimed_key_is_due_again_at_once_and_a_claim_moved_since_is_left(gate, gate_redis):
    gate.submit(Submission("a", b"m", record=b"r"))
    gate.submit(Submission("b", b"m", record=b"r"))
    claims = dict(gate.claim_unwritten(claim_seconds=30, batch=10))
    gate.submit(Submission("b", b"m2", record=b"r2"))  # b due again by a submission

    gate.unclaim_unwritten(claims.items())

    assert _due_now(gate, gate_redis) == {"a", "b"}
    assert sorted(k for k, _ in gate.claim_unwritten(claim_seconds=30, batch=10)) == ["a", "b"]


def test_a_deep_key_s_records_are_read_a_bounded_step_at_a_time_until_none_is_left(gate):
    gate.pause("deep")
    for start in range(0, 20_000, 500):
        gate.submit_many([Submission("deep", b"m", f"t{n}", record=b"r") for n in range(start, start + 500)])
    [claim] = gate.claim_unwritten(claim_seconds=30, batch=10)
    step = gate.unwritten(["deep"], per_key=500)
    assert 0 < len(step.records) <= 1000 and step.more == {"deep"}, "about one HSCAN step, not all 20,000"
    seen: set[int] = set()
    steps = 0
    while step.more:
        seen |= {u.ticket for u in step.records}
        gate.forget_unwritten(step.records)  # as a writer does: what a step read is deleted
        step = gate.unwritten(["deep"], per_key=500)
        steps += 1
        assert steps < 200, "each step goes on where the last stopped: it never stalls on emptied buckets"
    seen |= {u.ticket for u in step.records}
    assert seen == set(range(1, 20_001))
    gate.unclaim_unwritten([claim])


def test_a_reap_reads_a_key_s_unwritten_outcomes_a_bounded_step_at_a_time(make_gate, gate_redis):
    gate = make_gate(outcome_grace_seconds=0)
    gate_redis.hset(KeyNames("k").outcomes, mapping={f"t{n}#1": f"1|outcome {n}" for n in range(5000)})
    gate.submit(Submission("k", b"m"))  # the key is indexed for the reaper
    seen: set[bytes] = set()
    for _ in range(500):
        found = [r for r in gate.release("k", 999) if r.action is RecoveryAction.OUTCOME]
        assert len(found) <= 300, "a visit reads about a hundred, not all 5,000"
        seen |= {r.message for r in found}
        gate.forget_outcomes([("k", m.decode().replace("outcome ", "t") + "#1") for m in {r.message for r in found}])
        if len(seen) == 5000:
            break
    assert len(seen) == 5000


def test_a_background_pass_waits_out_the_record_delay_and_a_writer_that_shows_all_does_not(make_gate, gate_redis):
    gate = make_gate(record_delay_seconds=0.6)
    gate.submit(Submission("k", b"m1", record=b"r1"))
    time.sleep(0.2)
    gate.submit(Submission("k", b"m2", record=b"r2"))  # a later record does not put its key's first one off

    assert gate.claim_unwritten(claim_seconds=30, batch=10, young=False) == [], "younger than the delay"
    time.sleep(0.5)
    [(key, claim)] = gate.claim_unwritten(claim_seconds=30, batch=10, young=False)
    assert key == "k", "due once its first record is as old as the delay"
    gate.unclaim_unwritten([(key, claim)])

    gate.submit(Submission("j", b"m", record=b"r"))
    assert [k for k, _ in gate.claim_unwritten(claim_seconds=30, batch=10, young=False)] == ["k"]
    gate.unclaim_unwritten(gate.claim_unwritten(claim_seconds=30, batch=10, young=False))  # none: k is claimed
    assert [k for k, _ in gate.claim_unwritten(claim_seconds=30, batch=10)] == ["j"], (
        "a writer that shows every submission takes young records too, and passes a claimed key by"
    )


def test_finish_hands_back_its_submission_s_record_until_the_row_is_written(gate, gate_redis):
    first = gate.submit(Submission("k", b"m1", task_id="t1", record=b"r1"))
    second = gate.submit(Submission("k", b"m2", task_id="t2", record=b"r2"))
    started = gate.start(Start("k", first.ticket, 1))

    finished = gate.finish(Finish("k", first.ticket, started.token))

    kept = finished.unwritten
    assert kept is not None
    assert (kept.key, kept.ticket, kept.granted, kept.record, kept.message) == ("k", first.ticket, True, b"r1", b"m1")
    assert gate.unwritten(["k"]).records, "kept in the gate until the row is written"
    gate.forget_outcomes([], records=[("k", first.ticket)])
    assert [u.ticket for u in gate.unwritten(["k"]).records] == [second.ticket]

    # Written by a writer's pass before the run ended: nothing to hand back.
    gate.forget_unwritten(gate.unwritten(["k"]).records)
    again = gate.start(Start("k", second.ticket, 1))
    assert gate.finish(Finish("k", second.ticket, again.token)).unwritten is None


def test_a_run_that_blocks_its_key_hands_back_its_record_too(gate):
    submitted = gate.submit(Submission("k", b"m1", task_id="t1", record=b"r1"))
    started = gate.start(Start("k", submitted.ticket, 1))

    finished = gate.finish(Finish("k", submitted.ticket, started.token, block=True))

    assert finished.code.name == "BLOCKED" and finished.unwritten is not None
    assert finished.unwritten.record == b"r1"


def test_a_background_pass_leaves_a_key_s_young_records_and_comes_back_when_they_are_due(make_gate, gate_redis):
    """A key is due when its first record is; the records submitted since wait out the delay themselves."""
    gate = make_gate(record_delay_seconds=0.6)
    old = gate.submit(Submission("k", b"m1", record=b"r1"))
    time.sleep(0.7)
    young = gate.submit(Submission("k", b"m2", record=b"r2"))

    [claim] = gate.claim_unwritten(claim_seconds=30, batch=10, young=False)
    step = gate.unwritten(["k"], young=False)
    assert [u.ticket for u in step.records] == [old.ticket], "the young record is left, unread"
    assert set(step.later) == {"k"} and step.more == frozenset()
    gate.forget_unwritten(step.records, later=[(*claim, step.later["k"])])

    assert gate.claim_unwritten(claim_seconds=30, batch=10, young=False) == [], "not due again before it is"
    assert [u.ticket for u in gate.unwritten(["k"]).records] == [young.ticket], "a page's writer reads it"
    time.sleep(0.7)
    assert [k for k, _ in gate.claim_unwritten(claim_seconds=30, batch=10, young=False)] == ["k"]
    assert [u.ticket for u in gate.unwritten(["k"], young=False).records] == [young.ticket]
