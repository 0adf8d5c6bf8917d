"""``CeleryBackend`` in process, without workers: ``enqueue()`` fuzzed (hypothesis) submits once or refuses with
our error leaving nothing written, ``@task`` refuses bad key options, and ``get_result()`` maps each record
status. Real workers run these tasks in tests/userproject/test_django_tasks.py."""

import importlib.util
import sys
import uuid

import pytest
from django.utils import timezone
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from django_keyed_queue import InvalidKey, KeyedQueueError
from django_keyed_queue.records.models import KeyedTask
from django_keyed_queue.testing import write_submission_rows
from tests.django.queues import QUEUE
from tests.django.test_fuzz_submission import ANY

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(
        importlib.util.find_spec("django.tasks") is None and importlib.util.find_spec("django_tasks") is None,
        reason="Django's tasks framework needs Django 6.0+, or the django-tasks backport on Django 4.2 and 5.2",
    ),
]


@pytest.fixture
def tasks():
    from tests.django import framework_tasks

    return framework_tasks


def queued(broker) -> list[bytes]:
    """Every message on the tier's queue, whatever its priority (kombu keeps each step in a list of its own)."""
    return [m for name in broker.keys(f"{QUEUE}*") for m in broker.lrange(name, 0, -1)]


#: Arguments of any kind and size, a third one too many sometimes, and keywords.
CALLS = st.fixed_dictionaries(
    {"args": st.lists(ANY, min_size=0, max_size=3)},
    optional={"kwargs": st.dictionaries(st.sampled_from(["key", "n", "seconds", "colour"]), ANY, max_size=2)},
)


@pytest.mark.parametrize("name", ["keyed_step", "plain_step"])
@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])  # fmt: skip
@given(call=CALLS)
def test_any_enqueue_is_submitted_once_or_refused_with_our_error_and_nothing_written(
    name, call, tasks, gate_redis, broker
):
    gate_redis.flushdb()
    for key in broker.keys(f"{QUEUE}*"):
        broker.delete(key)
    KeyedTask.objects.all().delete()
    task = getattr(tasks, name)
    try:
        result = task.enqueue(*call["args"], **call.get("kwargs", {}))
    except KeyedQueueError as error:
        event(f"refused: {type(error).__name__}")
        assert str(error), "the error says what was wrong"
        assert gate_redis.dbsize() == 0 and queued(broker) == []
        assert not KeyedTask.objects.exists()
        return
    event("submitted")
    assert result.status == "READY" and result.enqueued_at is not None
    [message] = queued(broker)
    assert result.id.encode() in message
    write_submission_rows()
    rows = list(KeyedTask.objects.all())
    if name == "plain_step":
        assert rows == [] and gate_redis.dbsize() == 0, "a task without a key does not pass the gate"
        return
    [row] = rows
    key = {**dict(zip(["key", "n", "seconds"], result.args, strict=False)), **result.kwargs}["key"]
    assert (row.task_id, row.task_name, row.key) == (result.id, task.module_path, str(key))
    got = task.get_result(result.id)
    assert (got.status, got.args, got.kwargs) == ("READY", result.args, result.kwargs)


def test_task_refuses_key_options_it_cannot_use_when_it_is_made(tasks):
    from tests.django.framework_tasks import task

    with pytest.raises(InvalidKey, match="names 'account'"):
        task(key="account:{account}")(tasks.undecorated)
    with pytest.raises(ValueError, match="limit"):
        task(key="{key}", limit=0)(tasks.undecorated)
    with pytest.raises(TypeError, match="limit need a key"):
        task(limit=2)(tasks.undecorated)
    with pytest.raises(TypeError):
        task(key="{key}", limt=2)(tasks.undecorated)


def failure_text() -> str:
    from django_keyed_queue.worker.run import failure_text

    try:
        raise KeyError("missing")
    except KeyError as exc:
        return failure_text(exc)


#: Each record status, the framework's status it reads as, and the exception class its error names.
STATUSES = [
    ("waiting", "READY", None),
    ("dispatched", "READY", None),
    ("retrying", "READY", None),
    ("running", "RUNNING", None),
    ("succeeded", "SUCCESSFUL", None),
    ("ignored", "SUCCESSFUL", None),
    ("failed", "FAILED", "builtins.KeyError"),
    ("cancelled", "FAILED", "celery.exceptions.TaskRevokedError"),
    ("superseded", "FAILED", "celery.exceptions.TaskRevokedError"),
    ("rejected", "FAILED", "celery.exceptions.Reject"),
]


@pytest.mark.parametrize(("status", "reads", "error_class"), STATUSES)
def test_get_result_reads_each_record_status(tasks, status, reads, error_class, gate_redis):
    now = timezone.now()
    started = now if status not in ("waiting", "dispatched") else None
    finished = now if reads in ("SUCCESSFUL", "FAILED") and started else None
    task_id = str(uuid.uuid4())
    KeyedTask.objects.create(
        task_id=task_id, task_name=tasks.keyed_step.module_path, key="k", ticket=1, status=status,
        enqueued_at=now, started_at=started, finished_at=finished, attempts=2 if started else 0, worker="w1@host",
        error=failure_text() if status == "failed" else ("cancelled by an operator" if error_class else ""),
    )  # fmt: skip
    result = tasks.keyed_step.get_result(task_id)
    assert (result.status, result.enqueued_at, result.started_at, result.finished_at) == (reads, now, started, finished)
    assert result.attempts == (2 if started else 0) and result.worker_ids == ["w1@host"] * result.attempts
    assert [e.exception_class_path for e in result.errors] == ([error_class] if error_class else [])
    if status == "failed":
        assert result.errors[0].exception_class is KeyError and "missing" in result.errors[0].traceback


def test_get_result_of_an_unknown_id_or_another_kind_of_task_raises_does_not_exist(tasks, gate_redis):
    from django_keyed_queue.tasks_backend.framework import TaskResultDoesNotExist, TaskResultMismatch

    with pytest.raises(TaskResultDoesNotExist):
        tasks.keyed_step.get_result("no-such-task")
    KeyedTask.objects.create(task_id="a-celery-task", task_name="testproject.demo.tasks.step", key="k", ticket=1,
                             enqueued_at=timezone.now())  # fmt: skip
    with pytest.raises(TaskResultDoesNotExist, match="not a Django task"):
        tasks.keyed_step.get_result("a-celery-task")
    KeyedTask.objects.create(task_id="a-keyed-step", task_name=tasks.keyed_step.module_path, key="k", ticket=2,
                             enqueued_at=timezone.now())  # fmt: skip
    with pytest.raises(TaskResultMismatch):
        tasks.plain_step.get_result("a-keyed-step")


def test_a_task_name_read_back_imports_nothing(tasks, gate_redis):
    from django_keyed_queue.tasks_backend.framework import TaskResultDoesNotExist

    assert "this" not in sys.modules  # importing it would print the Zen of Python: a module with side effects
    KeyedTask.objects.create(task_id="named-elsewhere", task_name="this.s", key="k", ticket=1,
                             enqueued_at=timezone.now())  # fmt: skip
    with pytest.raises(TaskResultDoesNotExist, match="not a Django task"):
        tasks.keyed_step.get_result("named-elsewhere")
    assert "this" not in sys.modules
