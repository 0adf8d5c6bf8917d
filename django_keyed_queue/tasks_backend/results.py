"""A Django ``TaskResult`` from what we know of a task: its keyed task record, else Celery's result backend.

A keyed task's record (``KeyedTask``) gives its status, times, attempts and error; Celery's result
backend, where one is configured, its return value. A task without a key has no record: only
Celery's result backend knows it, once it stored something of it (see ``plain_result``).
"""

from __future__ import annotations

import re
import sys
from datetime import datetime
from typing import Any

from celery import Celery, states
from celery.backends.base import DisabledBackend
from django.utils import timezone

from ..exceptions import MessageRefused
from ..messaging.message import TaskMessage
from ..records.models import KeyedTask
from ..records.statuses import Status
from .framework import Task, TaskError, TaskResult, TaskResultDoesNotExist, TaskResultStatus, normalize_json
from .task import KeyedDjangoTask

#: Each record status as the framework names it; waiting for the key (and a retry's wait) reads READY.
STATUSES = {
    Status.WAITING: TaskResultStatus.READY,
    Status.DISPATCHED: TaskResultStatus.READY,
    Status.RETRYING: TaskResultStatus.READY,
    Status.RUNNING: TaskResultStatus.RUNNING,
    Status.SUCCEEDED: TaskResultStatus.SUCCESSFUL,
    # Ended on purpose by the task (Celery's Ignore): finished, with no value.
    Status.IGNORED: TaskResultStatus.SUCCESSFUL,
    Status.FAILED: TaskResultStatus.FAILED,
    # "Unable to start", in the framework's words.
    Status.CANCELLED: TaskResultStatus.FAILED,
    Status.SUPERSEDED: TaskResultStatus.FAILED,
    Status.REJECTED: TaskResultStatus.FAILED,
}

#: The exception a record's end that was no exception of the task's is shown as (Celery's own meaning).
ENDS_WITHOUT_EXCEPTION: dict[str, str] = {
    Status.CANCELLED: "celery.exceptions.TaskRevokedError",
    Status.SUPERSEDED: "celery.exceptions.TaskRevokedError",
    Status.REJECTED: "celery.exceptions.Reject",
}

#: Celery's states as the framework names them (PENDING is also Celery's answer for an unknown id).
CELERY_STATES = {
    states.RECEIVED: TaskResultStatus.READY,
    states.RETRY: TaskResultStatus.READY,
    states.STARTED: TaskResultStatus.RUNNING,
    states.SUCCESS: TaskResultStatus.SUCCESSFUL,
    states.FAILURE: TaskResultStatus.FAILED,
    states.REVOKED: TaskResultStatus.FAILED,
    states.REJECTED: TaskResultStatus.FAILED,
}


def django_task(task_name: str, task_id: str) -> KeyedDjangoTask:
    """The Django task named ``task_name`` (its module path, which is its Celery task's name), found in a
    module this process imported: a name read back from the database or Celery's result backend imports
    nothing (``Task.get_result`` is called on the task, whose module is imported)."""
    module_name, _, attribute = task_name.rpartition(".")
    module = sys.modules.get(module_name) if module_name else None
    found = getattr(module, attribute, None) if module is not None else None
    if not isinstance(found, Task):
        raise TaskResultDoesNotExist(f"{task_id} is a task of {task_name}, which is not a Django task (@task)")
    return found  # type: ignore[return-value]  # any backend's task: Task.get_result checks it is the caller's


def keyed_result(row: KeyedTask, alias: str, app: Celery) -> TaskResult[Any, Any]:
    """The framework's result of the keyed task whose latest record is ``row``."""
    task = django_task(row.task_name, row.task_id)
    status = STATUSES[Status(row.status)]
    args, kwargs = _arguments(row, app)
    result = TaskResult(
        task=task, id=row.task_id, status=status, enqueued_at=row.enqueued_at, started_at=row.started_at,
        last_attempted_at=row.started_at, finished_at=row.finished_at, args=args, kwargs=kwargs, backend=alias,
        errors=_errors(row) if status == TaskResultStatus.FAILED else [],
        # One per attempt; the record keeps the last attempt's worker only.
        worker_ids=[row.worker] * row.attempts,
    )  # fmt: skip
    if status == TaskResultStatus.SUCCESSFUL and row.status == Status.SUCCEEDED:
        _set_return_value(result, app)
    return result


def plain_result(task_id: str, alias: str, app: Celery) -> TaskResult[Any, Any]:
    """A task without a key, as Celery's result backend knows it: it needs ``CELERY_RESULT_EXTENDED = True``
    (to name the task) and knows a task only once it stored a state (``STARTED`` with
    ``CELERY_TASK_TRACK_STARTED``, else its end): before that, Celery cannot tell it from an unknown id."""
    if isinstance(app.backend, DisabledBackend):
        raise TaskResultDoesNotExist(
            f"no keyed task has the id {task_id!r}, and with no Celery result backend a task without a key "
            "has no result to read"
        )
    meta = app.backend.get_task_meta(task_id)
    name = meta.get("name")
    if meta.get("status") not in CELERY_STATES or not isinstance(name, str):
        raise TaskResultDoesNotExist(
            f"no keyed task has the id {task_id!r}, and Celery's result backend knows no task of it by name "
            "(a task without a key is known there once it started or ended, with CELERY_RESULT_EXTENDED = True)"
        )
    status = CELERY_STATES[meta["status"]]
    done = _aware(meta.get("date_done")) if status in (TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED) else None
    result = TaskResult(
        task=django_task(name, task_id), id=task_id, status=status, enqueued_at=None,
        started_at=_aware(meta.get("date_started")), last_attempted_at=_aware(meta.get("date_started")),
        finished_at=done, args=list(meta.get("args") or []), kwargs=dict(meta.get("kwargs") or {}), backend=alias,
        errors=[_celery_error(meta)] if status == TaskResultStatus.FAILED else [],
        worker_ids=[meta.get("worker") or ""] * ((meta.get("retries") or 0) + 1),
    )  # fmt: skip
    if status == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", normalize_json(meta.get("result")))
    return result


def _arguments(row: KeyedTask, app: Celery) -> tuple[list[Any], dict[str, Any]]:
    """The arguments the task was sent with, from the message its record keeps."""
    if not row.message:
        return [], {}
    try:
        message = TaskMessage.decode(row.message.encode(), app.conf.accept_content)
    except MessageRefused:
        return [], {}
    return list(message.args), dict(message.kwargs)


#: A traceback's last line: the exception's class, qualified by its module unless a builtin.
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*)(?::|$)", re.MULTILINE)


def _errors(row: KeyedTask) -> list[TaskError]:
    """The record's error as the framework's: its text, and the class it names (the record's first line)."""
    if row.status in ENDS_WITHOUT_EXCEPTION:
        return [TaskError(exception_class_path=ENDS_WITHOUT_EXCEPTION[row.status], traceback=row.error)]
    own = row.error.split("\n\nEarlier attempts:", 1)[0]
    name = own.split(":", 1)[0].strip()
    # The traceback's last line qualifies the name (``shop.errors.Declined: ...``); a builtin's stands alone.
    qualified = [found for found in _EXCEPTION_LINE.findall(own) if found.rsplit(".", 1)[-1] == name]
    if not name.isidentifier():  # an end the worker or the reaper described (a lost worker, a kill)
        return [TaskError(exception_class_path="builtins.Exception", traceback=row.error)]
    path = qualified[-1] if qualified and "." in qualified[-1] else f"builtins.{name}"
    return [TaskError(exception_class_path=path, traceback=row.error)]


def _celery_error(meta: dict[str, Any]) -> TaskError:
    exc = meta.get("result")
    path = (
        f"{type(exc).__module__}.{type(exc).__qualname__}" if isinstance(exc, BaseException) else "builtins.Exception"
    )
    return TaskError(exception_class_path=path, traceback=meta.get("traceback") or repr(exc))


def _set_return_value(result: TaskResult[Any, Any], app: Celery) -> None:
    """From Celery's result backend, if one is configured and still holds it; else it stays None."""
    if isinstance(app.backend, DisabledBackend):
        return
    meta = app.backend.get_task_meta(result.id)
    if meta.get("status") == states.SUCCESS:
        object.__setattr__(result, "_return_value", normalize_json(meta.get("result")))


def _aware(value: object) -> datetime | None:
    """A time Celery's result backend stored (ISO text, as it stores ``date_done``), aware (UTC if naive)."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return None
    if not isinstance(value, datetime):
        return None
    return value if timezone.is_aware(value) else timezone.make_aware(value, timezone.get_fixed_timezone(0))
