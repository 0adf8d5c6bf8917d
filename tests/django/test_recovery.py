"""Recovery from the operator's side: keyed_queue_reap, its dry run, and the records it settles."""

import io
import json
import signal
import subprocess
import time
from datetime import timedelta

import pytest
from celery.app.task import Context
from celery.signals import task_revoked
from django.core.management import call_command
from django.utils import timezone

from django_keyed_queue import explain
from django_keyed_queue.gate import Gate, Start
from django_keyed_queue.gate.keys import KeyNames
from django_keyed_queue.messaging.message import HEADER
from django_keyed_queue.process import totals
from django_keyed_queue.process.state import current
from django_keyed_queue.records.models import KeyedTask
from django_keyed_queue.testing import write_submission_rows
from django_keyed_queue.worker.killed import end_killed_run
from testproject.demo.tasks import step
from tests.django.queues import QUEUE
from tests.waiting import wait_until

pytestmark = pytest.mark.django_db


def lose_a_running_task(gate_redis, broker, *, max_lost, key="k"):
    """Submit a task, start it as a worker would with a tiny lease, and let the lease expire."""
    result = step.apply_async((key, 1), queue=QUEUE)
    broker.delete(QUEUE)  # the worker took the message
    short = Gate(gate_redis, lease_seconds=0.1)
    started = short.start(Start(key, 1, 1, max_lost=max_lost))
    assert started.ok
    wait_until(lambda: short.inspect(key).holders[1].deadline_in < 0, timeout=5, message="lease expiry")
    return result


def run(*args) -> str:
    out = io.StringIO()
    call_command("keyed_queue_reap", *args, stdout=out)
    return out.getvalue()


def test_dry_run_reports_and_changes_nothing(gate_redis, broker):
    lose_a_running_task(gate_redis, broker, max_lost=1)
    before = gate_redis.hgetall(KeyNames("k").holders)
    out = run("--dry-run")
    assert "would redispatch key='k' ticket=1" in out
    assert gate_redis.hgetall(KeyNames("k").holders) == before
    assert broker.llen(QUEUE) == 0


def test_a_lost_run_is_dispatched_again_and_recorded(gate_redis, broker):
    result = lose_a_running_task(gate_redis, broker, max_lost=1)
    out = run()
    assert "redispatch key='k' ticket=1" in out and "redispatch 1" in out
    message = json.loads(broker.lindex(QUEUE, 0))
    assert message["headers"]["id"] == result.id
    assert message["headers"][HEADER] == {"key": "k", "ticket": 1, "dispatch": 2}
    row = KeyedTask.objects.get(task_id=result.id)
    assert row.status == "dispatched" and "lease of attempt 1 expired" in row.error


def test_a_recovered_attempt_is_kept_on_its_record_whatever_the_next_does(gate_redis, broker):
    """Which worker ran the lost attempt, from when, and how it ended, a line of its notes that the next
    attempt's end leaves; its wait for its key stays its first start's."""
    result = lose_a_running_task(gate_redis, broker, max_lost=1)
    write_submission_rows()
    began = timezone.now()
    assert KeyedTask.objects.filter(task_id=result.id).update(
        status="running", attempts=1, worker="celery@host-a", started_at=began, first_started_at=began
    )
    run()
    [line] = KeyedTask.objects.get(task_id=result.id).notes.splitlines()
    assert line.startswith(f"attempt 1 on celery@host-a, started {began.isoformat(timespec='milliseconds')} ended ")
    assert line.endswith(": its worker was lost: the lease of attempt 1 expired; dispatched again")

    later = began + timedelta(seconds=30)  # attempt 2 runs elsewhere and succeeds
    KeyedTask.objects.filter(task_id=result.id).update(
        status="succeeded", attempts=2, worker="celery@host-b", started_at=later, finished_at=later, error=""
    )
    row = KeyedTask.objects.get(task_id=result.id)
    assert row.notes.splitlines() == [line] and row.waited == began - row.enqueued_at and row.ran == timedelta(0)
    assert explain(result.id).history == [line]


def test_a_lost_run_whose_record_never_said_where_it_ran_says_so(gate_redis, broker):
    result = lose_a_running_task(gate_redis, broker, max_lost=0)
    run()
    [line] = KeyedTask.objects.get(task_id=result.id).notes.splitlines()
    assert line.startswith("attempt 1 (its worker died before its record said where it ran) ended "), line
    assert line.endswith("no recoveries left"), line


def test_a_run_lost_once_too_often_fails_and_passes_the_key_on(gate_redis, broker):
    result = lose_a_running_task(gate_redis, broker, max_lost=0)
    follower = step.apply_async(("k", 2), queue=QUEUE)
    run()
    assert KeyedTask.objects.get(task_id=result.id).status == "failed"
    assert "no recoveries left" in KeyedTask.objects.get(task_id=result.id).error
    assert json.loads(broker.lindex(QUEUE, 0))["headers"]["id"] == follower.id
    assert KeyedTask.objects.get(task_id=follower.id).status == "waiting"  # dispatched once the flush runs


def start_a_task(gate_redis, broker, pid=None) -> tuple:
    """Submit a task and start it as a worker would: its result and the run's Celery request
    (``pid``: the process that runs it)."""
    result = step.apply_async(("k", 1), queue=QUEUE)
    broker.delete(QUEUE)
    started = Gate(gate_redis).start(Start("k", 1, 1, max_lost=3))
    assert started.ok
    return result, Context(id=result.id, worker_pid=pid, **{HEADER: {"key": "k", "ticket": 1, "dispatch": 1}})


def gone_process() -> int:
    """The number of a process that ran and ended (as a child process killed with SIGKILL)."""
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


@pytest.mark.django_db(transaction=True)
def test_a_run_terminated_by_celery_keeps_its_key_until_its_process_is_gone(gate_redis, broker):
    child_process = subprocess.Popen(["sleep", "60"])
    try:
        result, request = start_a_task(gate_redis, broker, pid=child_process.pid)
        follower = step.apply_async(("k", 2), queue=QUEUE)
        task_revoked.send(sender=step, request=request, terminated=True, signum=signal.SIGTERM, expired=False)

        holder = Gate(gate_redis).inspect("k").holders[1]
        assert holder.max_lost == holder.lost, "not recovered: it was killed on purpose"
        assert holder.stopping is not None and "its process terminated (SIGTERM)" in holder.stopping.how
        # The process outlives the signal for now: the key waits for it, however long that takes.
        time.sleep(0.5)
        assert broker.llen(QUEUE) == 0, "its next task waits"
        assert 1 in Gate(gate_redis).inspect("k").holders
    finally:
        child_process.kill()
        child_process.wait()
    wait_until(lambda: KeyedTask.objects.filter(task_id=result.id, status="cancelled").exists(), timeout=5,
               message="the run to end once its process is gone")  # fmt: skip
    row = KeyedTask.objects.get(task_id=result.id)
    assert "its process terminated (SIGTERM)" in row.error and f"its process {child_process.pid} ended" in row.error
    # Its row is written before the follower's message is published, in the same end.
    wait_until(lambda: broker.llen(QUEUE) > 0, timeout=5, message="the next task to be published")
    assert json.loads(broker.lindex(QUEUE, 0))["headers"]["id"] == follower.id


def test_a_run_sent_a_signal_it_survives_is_left_to_end_itself(gate_redis, broker):
    result, request = start_a_task(gate_redis, broker)
    before = gate_redis.hgetall(KeyNames("k").holders)
    task_revoked.send(sender=step, request=request, terminated=True, signum=signal.SIGUSR1, expired=False)
    assert gate_redis.hgetall(KeyNames("k").holders) == before
    write_submission_rows()
    assert KeyedTask.objects.get(task_id=result.id).status == "dispatched"


def test_a_kill_ends_only_the_attempt_its_message_names(gate_redis, broker):
    result, request = start_a_task(gate_redis, broker)
    before = gate_redis.hgetall(KeyNames("k").holders)
    replaced = {**getattr(request, HEADER), "dispatch": 2}  # a message the run did not start from
    killed = gone_process()
    limit = {"status": "failed", "reason": "hard time limit exceeded (1s)"}
    assert not end_killed_run(step.app, step.name, result.id, replaced, killed, **limit)
    assert not end_killed_run(step.app, step.name, result.id, None, killed, **limit)
    assert gate_redis.hgetall(KeyNames("k").holders) == before, "no attempt named: nothing ended"
    write_submission_rows()
    assert KeyedTask.objects.get(task_id=result.id).status == "dispatched"

    assert end_killed_run(step.app, step.name, result.id, getattr(request, HEADER), killed, **limit)
    row = KeyedTask.objects.get(task_id=result.id)
    assert row.status == "failed" and "hard time limit exceeded" in row.error
    assert Gate(gate_redis).inspect("k").holders == {}, "its process was gone: it ended at once"
    current().totals.flush()
    counted = Gate(gate_redis).totals()[0]
    assert int(counted[totals.field("fenced", step.name)]) == 1, "the kill of an attempt that no longer ran"
    assert int(counted[totals.field("finished", step.name, "failed")]) == 1
