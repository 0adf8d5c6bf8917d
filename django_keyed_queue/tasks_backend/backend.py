"""``CeleryBackend``: Django's tasks framework run by Celery workers, a task with ``key=`` through its key's queue.

``TASKS = {"default": {"BACKEND": "django_keyed_queue.tasks_backend.CeleryBackend"}}``. ``enqueue()``
checks the arguments (JSON's round trip, the task's signature) and the key before anything is written,
then submits through the Celery task's ``apply_async``; ``get_result()`` reads the task's record.
"""

from __future__ import annotations

import inspect
import json
from typing import Any

from celery import current_app
from django.utils import timezone

from ..exceptions import InvalidArguments
from ..process.state import get_gate
from ..records import submissions
from ..records.models import KeyedTask
from .framework import (
    DEFAULT_TASK_QUEUE_NAME,
    TASK_MAX_PRIORITY,
    TASK_MIN_PRIORITY,
    BaseTaskBackend,
    InvalidTask,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    normalize_json,
    task_enqueued,
)
from .results import keyed_result, plain_result
from .task import KeyedDjangoTask

#: Celery's priorities on its brokers: 0 to 9 (kombu's Redis transport groups them in steps, 0 first).
CELERY_MAX_PRIORITY = 9
#: Brokers on which a lower Celery priority runs sooner (kombu's Redis transport); elsewhere a higher one does.
LOW_FIRST_BROKERS = frozenset({"redis", "rediss", "sentinel", "socket"})


class CeleryBackend(BaseTaskBackend):
    task_class = KeyedDjangoTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> TaskResult[Any, Any]:
        self.validate_task(task)
        if not isinstance(task, KeyedDjangoTask):
            raise InvalidTask(f"{task.module_path}: CeleryBackend runs tasks made by @task with it as their backend")
        args, kwargs = json_arguments(task, args, kwargs)
        signature = inspect.signature(task.celery_task.run)
        try:
            signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise InvalidArguments(f"{task.module_path}: {exc}") from exc
        enqueued_at = timezone.now()
        celery_task = task.celery_task
        sent = celery_task.apply_async(args, kwargs, **celery_options(task, celery_task.app))
        result = TaskResult(
            task=task, id=sent.id, status=TaskResultStatus.READY, enqueued_at=enqueued_at, started_at=None,
            last_attempted_at=None, finished_at=None, args=args, kwargs=kwargs, backend=self.alias, errors=[],
            worker_ids=[],
        )  # fmt: skip
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult[Any, Any]:
        """From the task's record (its latest, if Celery reused the id); a task without a key from Celery's
        result backend. ``TaskResultDoesNotExist`` for an id neither knows."""
        if not isinstance(result_id, str) or not result_id:
            raise TaskResultDoesNotExist(f"no task has the id {result_id!r}")
        row = _latest_row(result_id)
        if row is None:
            # Its row may not be written yet (no worker running writes it): write what the gate keeps, as
            # the status command does, at most one batch.
            submissions.write_due(get_gate(), max_batches=1)
            row = _latest_row(result_id)
        if row is not None:
            return keyed_result(row, self.alias, current_app)
        return plain_result(result_id, self.alias, current_app)


def _latest_row(task_id: str) -> KeyedTask | None:
    return KeyedTask.objects.filter(task_id=task_id).order_by("-id").first()


def json_arguments(task: KeyedDjangoTask, args: Any, kwargs: Any) -> tuple[list[Any], dict[str, Any]]:
    """The arguments as they come back from JSON, which the framework requires them to make unchanged (a
    tuple is a list, as in Django's own backends); else ``InvalidArguments``."""
    try:
        sent = normalize_json({"args": list(args), "kwargs": dict(kwargs)})
        back = json.loads(json.dumps(sent, allow_nan=False))
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidArguments(f"{task.module_path}: the arguments must be JSON-serializable: {exc}") from exc
    if back != sent:
        raise InvalidArguments(
            f"{task.module_path}: the arguments change in JSON's round trip (a dict key that is not a str?)"
        )
    return back["args"], back["kwargs"]


def celery_options(task: KeyedDjangoTask, app: Any) -> dict[str, Any]:
    """``apply_async``'s options from the task's: its queue (``"default"``: Celery's routing decides),
    priority and ``run_after`` (Celery's ``eta``)."""
    options: dict[str, Any] = {"priority": celery_priority(task.priority, app.conf.broker_url)}
    if task.queue_name != DEFAULT_TASK_QUEUE_NAME:
        options["queue"] = task.queue_name
    if task.run_after is not None:
        options["eta"] = task.run_after
    return options


def celery_priority(priority: int, broker_url: str | None) -> int:
    """Django's priority (-100 to 100, higher runs sooner) as Celery's 0 to 9 on the broker's scale."""
    scaled = (priority - TASK_MIN_PRIORITY) * CELERY_MAX_PRIORITY // (TASK_MAX_PRIORITY - TASK_MIN_PRIORITY)
    scheme = broker_url.split("://", 1)[0] if isinstance(broker_url, str) and "://" in broker_url else "amqp"
    return CELERY_MAX_PRIORITY - scaled if scheme in LOW_FIRST_BROKERS else scaled
