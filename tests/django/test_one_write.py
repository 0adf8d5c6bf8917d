"""A run that ends before its submission's row is written writes that row once, in its final state.

The workers' writers write a submission's row only once its record in the gate is
``KEYED_QUEUE_RECORD_DELAY_SECONDS`` old; ``finish`` hands a run its record while it is still kept, and
the run's end is the one INSERT. The record stays in the gate until the row is written, so a process
killed in between loses nothing.
"""

import time
from datetime import timedelta

import pytest
from django.db import OperationalError, connections
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_keyed_queue.gate import Lease, Start
from django_keyed_queue.gate.keys import KeyNames
from django_keyed_queue.process.state import current
from django_keyed_queue.records import submissions
from django_keyed_queue.records.models import KeyedTask
from django_keyed_queue.records.statuses import Status
from django_keyed_queue.records.transitions import Transition, describe_arguments
from django_keyed_queue.testing import write_submission_rows
from django_keyed_queue.worker.run import Run
from testproject.demo.tasks import step
from tests.django.queues import QUEUE

pytestmark = pytest.mark.django_db


def run_to_its_end(task_id: str, key: str, ticket: int, *, error: Exception | None = None) -> None:
    """What a worker's child process does with a granted message: start it, run it, finish it (its start's
    record, buffered by ``Run.begin``, is left out: the end alone is written)."""
    started = current().gate.start(Start(key, ticket, 1, task_id=task_id))
    assert started.ok
    step.push_request(id=task_id, hostname="w1")
    try:
        run = Run(step, Lease(key, ticket, started.token), attempts=1)
        assert run.fail(error) if error else run.succeed()
    finally:
        step.pop_request()


def keyed_task_writes(queries) -> list[str]:
    """The statements of ``queries`` that wrote the records' table: INSERT or UPDATE, one per statement
    (an executemany is one, as Django's debug cursor logs it: "N times: <sql>")."""
    table = KeyedTask._meta.db_table
    found = []
    for query in queries:
        sql = query["sql"].split(": ", 1)[1] if " times: " in query["sql"] else query["sql"]
        verb = sql.lstrip().split(None, 1)[0].upper()
        if table in sql and verb in ("INSERT", "UPDATE"):
            found.append(verb)
    return found


def flush_counting_writes() -> list[str]:
    with CaptureQueriesContext(connections[KeyedTask.objects.db_for_write()]) as queries:
        current().recorder.flush()
    return keyed_task_writes(queries)


def test_a_run_that_ends_before_its_row_is_written_writes_it_once_as_it_ended(gate_redis, broker):
    before = timezone.now()
    result = step.apply_async(("ow", 0), queue=QUEUE)

    run_to_its_end(result.id, "ow", 1)

    assert flush_counting_writes() == ["INSERT"], "one statement for the row, and no UPDATE of it"
    row = KeyedTask.objects.get(task_id=result.id)
    assert (row.status, row.attempts, row.ticket) == ("succeeded", 1, 1)
    # As a writer's pass would have written it: the gate's time of the submission, the producer's arguments.
    assert before - timedelta(seconds=1) < row.enqueued_at <= row.finished_at
    assert row.dispatched_at == row.enqueued_at, "granted at its submission"
    assert row.arguments == describe_arguments(step.name, ("ow", 0), {})
    assert result.id in row.message, "its stored message, as a writer's pass keeps it (Django tasks read its args)"
    assert current().gate.unwritten(["ow"]).records == [], "its record is deleted once its row is written"
    assert write_submission_rows() == 0


def test_a_failed_run_s_one_row_keeps_its_message_for_a_retry(gate_redis, broker):
    result = step.apply_async(("ow", 0), queue=QUEUE)

    run_to_its_end(result.id, "ow", 1, error=ValueError("card declined"))

    assert flush_counting_writes() == ["INSERT"]
    row = KeyedTask.objects.get(task_id=result.id)
    assert row.status == "failed" and "card declined" in row.error
    assert result.id in row.message, "what an operator's Retry submits again"


def test_a_run_that_ends_after_its_row_was_written_updates_it(gate_redis, broker):
    result = step.apply_async(("ow", 0), queue=QUEUE)
    assert write_submission_rows() == 1

    run_to_its_end(result.id, "ow", 1)

    assert flush_counting_writes() == ["UPDATE"]
    assert KeyedTask.objects.get(task_id=result.id).status == "succeeded"


def test_a_batch_of_rows_to_make_and_rows_to_move_is_written_whole(gate_redis, broker):
    """The runs' ends that make their rows and those that find theirs, in one flush: one statement each."""
    young = [step.apply_async((f"young{n}", 0), queue=QUEUE) for n in range(3)]
    old = [step.apply_async((f"old{n}", 0), queue=QUEUE) for n in range(3)]
    submissions.write_key(current().gate, "old0")
    submissions.write_key(current().gate, "old1")
    submissions.write_key(current().gate, "old2")

    for n, result in enumerate([*young, *old]):
        run_to_its_end(result.id, f"young{n}" if n < 3 else f"old{n - 3}", 1)

    assert sorted(flush_counting_writes()) == ["INSERT", "UPDATE"]
    assert set(KeyedTask.objects.values_list("status", flat=True)) == {"succeeded"}
    assert KeyedTask.objects.count() == 6


@override_settings(KEYED_QUEUE_RECORD_DELAY_SECONDS=0.5)
def test_a_record_waits_out_the_delay_and_a_process_killed_after_its_finish_loses_nothing(gate_redis, broker):
    gate = current().gate
    result = step.apply_async(("ow", 0), queue=QUEUE)
    assert submissions.write_due(gate, young=False) == 0, "a background pass leaves a young record"

    run_to_its_end(result.id, "ow", 1)
    with current().recorder._lock:
        current().recorder._pending.clear()  # the process is killed before its recorder wrote anything

    assert gate_redis.hexists(KeyNames("ow").outcomes, f"{result.id}#1"), "the run's outcome is kept"
    time.sleep(0.6)
    assert submissions.write_due(gate, young=False) == 1, "the kept record is written past the delay"
    assert KeyedTask.objects.get(task_id=result.id).status == "dispatched"


def buffer_young_start(task_id: str):
    """What ``Run.begin`` buffers for the run of a submission younger than the record delay (key "ow",
    ticket 1): its start, which makes its row. The process's recorder."""
    recorder, now = current().recorder, timezone.now()
    running = {"started_at": now, "worker": "w1"}
    create = {"task_name": step.name, "enqueued_at": now, "args": ("ow", 0), "kwargs": {}}
    recorder.buffer(Transition(task_id, "ow", 1, Status.RUNNING, 1, running, insert_first=True, create=create))
    return recorder


def test_a_run_that_ends_while_a_flush_makes_its_row_updates_it_and_the_batch_stays_whole(
    gate_redis, broker, monkeypatch
):
    """A run's start makes its row in a flush that is still writing when the run ends: the end is buffered to
    update that row. Were it inserted too, its batch's one INSERT would fail over to a statement a row."""
    result = step.apply_async(("ow", 0), queue=QUEUE)
    recorder = buffer_young_start(result.id)
    apply, ended = KeyedTask.objects.apply_setting_aside, []

    def run_ends_meanwhile(*args, **kwargs):
        run_to_its_end(result.id, "ow", 1)
        ended.append(recorder.peek((result.id, "ow", 1)))
        return apply(*args, **kwargs)

    monkeypatch.setattr(KeyedTask.objects, "apply_setting_aside", run_ends_meanwhile)
    recorder.flush()
    monkeypatch.undo()

    [buffered] = ended
    assert buffered is not None and buffered.status == Status.SUCCEEDED and not buffered.insert_first
    assert KeyedTask.objects.get(task_id=result.id).status == Status.RUNNING
    assert flush_counting_writes() == ["UPDATE"]
    assert KeyedTask.objects.get(task_id=result.id).status == Status.SUCCEEDED
    assert current().gate.unwritten(["ow"]).records == [], "its record is deleted once its row is written"


def test_a_run_that_ended_while_a_failed_flush_was_making_its_row_makes_it(gate_redis, broker, monkeypatch):
    result = step.apply_async(("ow", 0), queue=QUEUE)
    recorder = buffer_young_start(result.id)

    def database_down(*args, **kwargs):
        run_to_its_end(result.id, "ow", 1)  # the run ends while the flush writes
        raise OperationalError("the database went away")

    monkeypatch.setattr(KeyedTask.objects, "apply_setting_aside", database_down)
    with pytest.raises(OperationalError):
        recorder.flush()
    monkeypatch.undo()

    buffered = recorder.peek((result.id, "ow", 1))
    assert buffered is not None and buffered.insert_first, "the start put back keeps its insert"
    assert flush_counting_writes() == ["INSERT"]
    assert KeyedTask.objects.get(task_id=result.id).status == Status.SUCCEEDED


def test_an_end_settled_while_another_writer_writes_its_row_lands_on_that_row(gate_redis, broker, monkeypatch):
    """A killed run's end (``submissions.settle``) finds no row; before it writes the key's kept records
    itself, another writer (an operator's page, a worker's pass) writes them and forgets them. The end
    settles the row that writer made, and is not lost (the row stayed ``dispatched`` for good)."""
    gate = current().gate
    result = step.apply_async(("ow", 0), queue=QUEUE)
    real_settle = KeyedTask.objects.settle
    calls = []

    def settle_then_another_writer_writes(*args, **kwargs):
        changed = real_settle(*args, **kwargs)
        if not calls:
            assert changed == 0, "no row yet"
            assert submissions.write(gate, ["ow"]) == 1, "the other writer writes the row and forgets the record"
        calls.append(changed)
        return changed

    monkeypatch.setattr(KeyedTask.objects, "settle", settle_then_another_writer_writes)
    changed = submissions.settle(gate, result.id, "ow", 1, Status.CANCELLED, error="stopped")

    assert changed == 1 and KeyedTask.objects.get(task_id=result.id).status == "cancelled"
