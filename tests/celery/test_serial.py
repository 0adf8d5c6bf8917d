"""Keyed tasks on real prefork workers: order, exclusion, limits, failures and retries."""

import pytest

from django_keyed_queue.records.models import KeyedTask
from testproject.demo.history import read as read_history
from testproject.demo.tasks import failing_step, flaky_step, step, step_pair
from testproject.history_checks import assert_serial
from tests.waiting import wait_for_records

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.workers]


def test_one_key_runs_in_submission_order_without_overlap(workers, gate_redis):
    results = [step.delay("k1", n, 0.02) for n in range(15)]
    records = wait_for_records(r.id for r in results)
    starts = assert_serial(read_history())
    assert starts["k1"] == list(range(15))
    assert [records[r.id].ticket for r in results] == list(range(1, 16))
    assert {records[r.id].status for r in results} == {"succeeded"}
    assert all(rec.started_at and rec.finished_at and rec.worker and rec.attempts == 1 for rec in records.values())


def test_limit_allows_that_many_at_once(workers, gate_redis):
    results = [step_pair.delay("pair", n, 0.3) for n in range(8)]
    wait_for_records(r.id for r in results)
    events = read_history()
    assert_serial(events, limit=2)
    running, most = 0, 0
    for e in events:
        running += 1 if e["event"] == "start" else -1
        most = max(most, running)
    assert most == 2, "limit=2 should let two tasks of the key overlap"


def test_failure_passes_the_key_on(workers, gate_redis):
    failed = failing_step.delay("f", 0)
    after = step.delay("f", 1)
    records = wait_for_records([failed.id, after.id])
    assert records[failed.id].status == "failed"
    error = records[failed.id].error
    assert error.splitlines()[0] == "RuntimeError: step 0 of f fails on purpose", error
    assert "Traceback (most recent call last):" in error and "failing_step" in error, "the admin shows where"
    assert records[after.id].status == "succeeded"
    assert assert_serial(read_history())["f"] == [0, 1]
    assert after.get(timeout=10) == 1


def test_retry_keeps_its_place(workers, gate_redis):
    flaky = flaky_step.delay("r", 0, failures=2, countdown=0.5)
    later = [step.delay("r", n) for n in (1, 2)]
    records = wait_for_records([flaky.id, *(r.id for r in later)])
    events = [e for e in read_history() if e["event"] == "start"]
    # The retries of task 0 (after 0.5 s countdowns) still run before tasks 1 and 2.
    assert [(e["n"], e.get("attempt")) for e in events] == [(0, 0), (0, 1), (0, 2), (1, None), (2, None)]
    assert records[flaky.id].status == "succeeded"
    assert records[flaky.id].attempts == 3
    assert flaky.get(timeout=10) == 0
    # Every attempt's error is kept on the record, newest first.
    kept = records[flaky.id].error
    assert kept.startswith("Earlier attempts:\n\nattempt 2: ConnectionError: the bank timed out on attempt 2")
    assert "\n\nattempt 1: ConnectionError: the bank timed out on attempt 1" in kept


def test_retry_records_pass_through_retrying(workers, gate_redis):
    flaky = flaky_step.delay("rr", 0, failures=1, countdown=2.0)

    def retrying():
        row = KeyedTask.objects.filter(task_id=flaky.id).first()
        return row is not None and row.status == "retrying"

    from tests.waiting import wait_until

    wait_until(retrying, timeout=10, message="the record to show retrying")
    error = KeyedTask.objects.get(task_id=flaky.id).error
    assert error.startswith("it retries after: ConnectionError: the bank timed out on attempt 1"), error
    wait_for_records([flaky.id])


def test_delayed_task_joins_its_queue_when_due(workers, gate_redis):
    delayed = step.apply_async(("d", 0), countdown=1.5)
    ready = step.delay("d", 1)
    records = wait_for_records([delayed.id, ready.id])
    # The delayed task did not block the ready one submitted after it.
    assert assert_serial(read_history(), accepted={"d": [1, 0]})["d"] == [1, 0]
    assert records[ready.id].ticket < records[delayed.id].ticket
    assert records[delayed.id].status == "succeeded"


def test_a_task_that_expires_while_parked_passes_its_key_on(workers, gate_redis):
    first = step.delay("exp", 0, 1.0)
    expiring = step.apply_async(("exp", 1), expires=0.3)  # counted from now, not from its publish
    last = step.delay("exp", 2)
    records = wait_for_records([first.id, expiring.id, last.id], timeout=30)
    assert (records[expiring.id].status, records[expiring.id].error) == ("cancelled", "cancelled by Celery: it expired")
    assert records[last.id].status == "succeeded"
    events = read_history()
    assert assert_serial(events, accepted={"exp": [0, 2]})["exp"] == [0, 2]
    ended, started = (
        next(e["t"] for e in events if (e["event"], e["n"]) == pair) for pair in (("end", 0), ("start", 2))
    )
    assert started - ended < 5, "the key passed on at once, not after the dispatch timeout"


def test_a_task_submitted_in_a_transaction_that_rolls_back_still_runs_and_is_recorded(workers, gate_redis):
    """Plain delay() takes its ticket at once, as Celery publishes at once (docs/guarantees.md, "Enqueue
    on commit"): its row goes with the rollback, and the worker writes it again when the task runs."""
    from django.db import transaction

    with pytest.raises(RuntimeError), transaction.atomic():
        result = step.delay("rolled-back", 1)
        raise RuntimeError("roll back")
    records = wait_for_records([result.id])
    assert (records[result.id].status, records[result.id].ticket) == ("succeeded", 1)
