"""Submissions' rows, written from the records the gate keeps with their tickets (``records.submissions``)."""

import logging
import subprocess

import pytest
from django.test import override_settings
from django.utils import timezone

from django_keyed_queue.gate import Finish, Start
from django_keyed_queue.gate.keys import KeyNames
from django_keyed_queue.process.state import get_gate
from django_keyed_queue.records import submissions
from django_keyed_queue.records.models import KeyedTask
from django_keyed_queue.records.statuses import Status
from django_keyed_queue.records.transitions import Transition
from django_keyed_queue.testing import write_submission_rows
from django_keyed_queue.worker.killed import end_killed_run
from testproject.demo.tasks import step
from tests.django.queues import QUEUE
from tests.gate_redis import UNWRITTEN, index_scores

pytestmark = pytest.mark.django_db


def test_rows_are_written_once_with_their_message_and_the_gate_forgets_the_records(gate_redis, broker):
    first = step.apply_async(("k", 1), queue=QUEUE, argsrepr="('k', '<one>')")
    second = step.apply_async(("k", 2), queue=QUEUE)
    assert not KeyedTask.objects.exists()

    assert write_submission_rows() == 2
    assert write_submission_rows() == 0, "written records are forgotten"
    assert not gate_redis.exists(KeyNames("k").unwritten) and not index_scores(gate_redis, UNWRITTEN)
    rows = {r.task_id: r for r in KeyedTask.objects.all()}
    assert (rows[first.id].status, rows[first.id].ticket, rows[first.id].arguments) == (
        "dispatched", 1, "args=('k', '<one>') kwargs={}",
    )  # fmt: skip
    assert (rows[second.id].status, rows[second.id].ticket, rows[second.id].dispatched_at) == ("waiting", 2, None)
    for row in rows.values():
        assert row.message.encode() == gate_redis.hget(KeyNames("k").messages, row.ticket), "what a rebuild needs"
        assert abs((timezone.now() - row.enqueued_at).total_seconds()) < 5


def test_a_row_its_worker_wrote_first_keeps_its_progress_and_gains_its_message(gate_redis, broker):
    result = step.apply_async(("k", 1), queue=QUEUE)
    started = {"task_name": step.name, "enqueued_at": timezone.now(), "args": ("k", 1), "kwargs": {}}
    KeyedTask.objects.apply(Transition(result.id, "k", 1, Status.RUNNING, 1, {"worker": "w1"}, create=started))

    assert write_submission_rows() == 1
    row = KeyedTask.objects.get(task_id=result.id)
    assert (row.status, row.attempts, row.worker) == ("running", 1, "w1"), "the submission's record moves nothing back"
    assert row.message and row.message.encode() == gate_redis.hget(KeyNames("k").messages, 1)


def test_a_record_written_after_its_task_finished_leaves_the_row_finished(gate_redis, broker):
    result = step.apply_async(("k", 1), queue=QUEUE)
    gate = get_gate()
    gate.finish(Finish("k", 1, gate.start(Start("k", 1, 1)).token))
    done = {"task_name": step.name, "enqueued_at": timezone.now(), "args": ("k", 1), "kwargs": {}}
    KeyedTask.objects.apply(Transition(result.id, "k", 1, Status.SUCCEEDED, 1, {}, create=done))

    assert write_submission_rows() == 1
    assert KeyedTask.objects.get(task_id=result.id).status == "succeeded"


def test_ending_a_run_whose_row_is_not_written_yet_writes_it_first(gate_redis, broker):
    result = step.apply_async(("k", 1), queue=QUEUE)
    assert get_gate().start(Start("k", 1, 1)).ok
    header = {"key": "k", "ticket": 1, "dispatch": 1}

    killed = subprocess.Popen(["true"])
    killed.wait()

    assert end_killed_run(step.app, step.name, result.id, header, killed.pid, status="failed",
                          reason="hard time limit exceeded")  # fmt: skip

    row = KeyedTask.objects.get(task_id=result.id)
    assert (row.status, row.error) == ("failed", f"hard time limit exceeded; its process {killed.pid} ended")
    assert write_submission_rows() == 0


def test_a_record_that_is_not_one_is_logged_and_dropped_and_the_others_are_written(gate_redis, broker, caplog):
    result = step.apply_async(("k", 1), queue=QUEUE)
    gate_redis.hset(KeyNames("k").unwritten, 99, b"w|1700000000000|" + b'{"task_id": 7}')
    gate_redis.hset(KeyNames("j").unwritten, 1, b"w|1700000000000|not json")
    gate_redis.hset(KeyNames("j").unwritten, 2, b"no separators at all")
    record = b'{"task_id": "t", "task_name": "n", "arguments": ""}'
    gate_redis.hset(KeyNames("j").unwritten, 3, b"w|" + b"9" * 400 + b"|" + record)  # past a float's range
    gate_redis.zadd(UNWRITTEN.shard_of("j"), {"j": 0})

    with caplog.at_level(logging.ERROR, logger=submissions.__name__):
        assert write_submission_rows() == 1
    assert [r.task_id for r in KeyedTask.objects.all()] == [result.id]
    assert caplog.text.count("keeps a submission record that is not one") == 4
    assert gate_redis.exists(KeyNames("k").unwritten, KeyNames("j").unwritten) == 0
    assert not index_scores(gate_redis, UNWRITTEN)


def test_a_failed_database_write_keeps_the_records_for_the_next_writer(gate_redis, broker, monkeypatch):
    result = step.apply_async(("k", 1), queue=QUEUE)

    def database_down(*transitions, **options):
        raise RuntimeError("database unreachable")

    with monkeypatch.context() as patched:
        patched.setattr(KeyedTask.objects, "apply", database_down)
        with pytest.raises(RuntimeError):
            write_submission_rows()
    assert gate_redis.hlen(KeyNames("k").unwritten) == 1
    assert gate_redis.zscore(UNWRITTEN.shard_of("k"), "k") == 0, "the failed writer gave its claim back"
    assert write_submission_rows() == 1
    assert KeyedTask.objects.filter(task_id=result.id).exists()


def test_a_deep_key_s_rows_are_all_written_a_bounded_step_at_a_time(gate_redis, broker):
    step.apply_async_many([("deep", n) for n in range(1200)], queue=QUEUE)
    assert write_submission_rows() == 1200
    assert KeyedTask.objects.filter(key="deep").count() == 1200
    assert not index_scores(gate_redis, UNWRITTEN) and not gate_redis.exists(KeyNames("deep").unwritten)


@override_settings(KEYED_QUEUE_RECORD_DELAY_SECONDS=5)
def test_a_background_pass_refuses_a_record_stamped_in_no_real_time_instead_of_waiting_for_it(gate_redis, caplog):
    """A young record waits out the delay; one stamped over a day ahead is no submission's to wait for: it is
    read now, and written or refused as any other."""
    record = b'{"task_id": "t", "task_name": "n", "arguments": ""}'
    gate_redis.hset(KeyNames("j").unwritten, 3, b"w|" + b"9" * 400 + b"|" + record)  # past a float's range
    gate_redis.hset(KeyNames("j").unwritten, 4, b"w|99999999999999|" + record)  # in the year 5138
    gate_redis.zadd(UNWRITTEN.shard_of("j"), {"j": 0})

    with caplog.at_level(logging.ERROR, logger=submissions.__name__):
        assert submissions.write_due(get_gate(), young=False) == 1, "the year 5138's, a time a row can hold"
    assert caplog.text.count("keeps a submission record that is not one") == 1, "past a float's range"
    assert gate_redis.exists(KeyNames("j").unwritten) == 0 and not index_scores(gate_redis, UNWRITTEN)
