"""A Django task (``@task``) run by Celery workers: with ``key=``, a keyed serial task; without, a plain one.

The Celery task is made, and shared with every Celery app as ``shared_task`` shares one, when the
``@task`` decorator makes the Django task: a worker registers it when ``autodiscover_tasks()``
imports the app's ``tasks.py``. Its name is the Django task's ``module_path``, which is also the
name Celery gives a function of that module.
"""

from __future__ import annotations

import dataclasses
import inspect
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from celery import current_task, shared_task
from django.utils import timezone

from ..keyed_task.decorators import keyed_serial_task
from .framework import (
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultStatus,
    normalize_json,
    task_finished,
    task_started,
)

if TYPE_CHECKING:
    TaskBase = Task[..., Any]
else:
    TaskBase = Task  # Django's Task is generic in its stubs only


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyedDjangoTask(TaskBase):
    """``CeleryBackend``'s task class: ``@task(key=..., ...)`` takes the options of ``@keyed_serial_task``."""

    #: A ``str.format`` template over the task's arguments, or a callable taking them; None: a plain Celery task.
    key: str | Callable[..., str] | None = None
    limit: int = 1
    rate: str | None = None
    on_failure: str = "continue"
    coalesce: bool | None = None
    debounce: float | None = None
    max_recoveries: int | None = None
    max_waiting: int | None = None
    idempotent: bool = False

    def __post_init__(self) -> None:
        Task.__post_init__(self)  # a slotted dataclass's methods cannot call super() without arguments
        celery_task_of(self)  # refuses bad key options now, as @keyed_serial_task does at import

    @property
    def celery_task(self) -> Any:
        """The Celery task that runs this task on the workers (a proxy to the current app's)."""
        return celery_task_of(self)


#: The Celery task of each Django task's function, made once per process (``using()`` copies share it).
_celery_tasks: dict[Callable[..., Any], Any] = {}
_making = threading.Lock()


def celery_task_of(task: KeyedDjangoTask) -> Any:
    made = _celery_tasks.get(task.func)
    if made is None:
        with _making:
            made = _celery_tasks.get(task.func)
            if made is None:
                made = _celery_tasks[task.func] = _make_celery_task(task)
    return made


#: ``@task``'s options that are ``@keyed_serial_task``'s: each is passed on when given (not at its default).
KEY_OPTIONS = ("limit", "rate", "on_failure", "coalesce", "debounce", "max_recoveries", "max_waiting", "idempotent")


def _make_celery_task(task: KeyedDjangoTask) -> Any:
    run = _runner(task)
    given = {
        f.name: getattr(task, f.name)
        for f in dataclasses.fields(task)
        if f.name in KEY_OPTIONS and getattr(task, f.name) != f.default
    }
    if task.key is None:
        if given:
            raise TypeError(f"{task.module_path}: {', '.join(given)} need a key: @task(key=..., ...)")
        return shared_task(name=task.module_path)(run)
    return keyed_serial_task(key=task.key, name=task.module_path, **given)(run)


def _runner(task: KeyedDjangoTask) -> Callable[..., Any]:
    """The Celery task's function: the Django task's arguments (its ``context`` left out), run as Django runs it."""

    def run(*args: Any, **kwargs: Any) -> Any:
        return run_on_worker(task, args, kwargs)

    params = list(inspect.signature(task.func).parameters.values())
    # Celery checks a call's arguments, and a key template is formatted, against this signature.
    run.__signature__ = inspect.Signature(params[1:] if task.takes_context else params)  # type: ignore[attr-defined]
    run.__name__, run.__qualname__, run.__module__ = task.func.__name__, task.func.__qualname__, task.func.__module__
    run.__doc__ = task.func.__doc__
    return run


def run_on_worker(task: KeyedDjangoTask, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run the Django task in a Celery worker, with Django's ``task_started`` and ``task_finished`` signals;
    its return value must make JSON's round trip (else the task fails, as in Django's own backends)."""
    request = current_task.request
    # A keyed run's attempt (a recovery counts); a plain task's, from Celery's retries.
    attempts = getattr(request, "keyed_attempts", None) or (request.retries or 0) + 1
    started = timezone.now()
    result = TaskResult(
        task=task, id=str(request.id), status=TaskResultStatus.RUNNING, enqueued_at=None, started_at=started,
        last_attempted_at=started, finished_at=None, args=list(args), kwargs=dict(kwargs), backend=task.backend,
        errors=[], worker_ids=[request.hostname or ""] * attempts,
    )  # fmt: skip
    sender = type(task.get_backend())
    task_started.send(sender=sender, task_result=result)
    try:
        if task.takes_context:
            value = normalize_json(task.call(TaskContext(task_result=result), *args, **kwargs))
        else:
            value = normalize_json(task.call(*args, **kwargs))
    except Exception as exc:
        error = TaskError(exception_class_path=class_path(type(exc)), traceback=_traceback(exc))
        result.errors.append(error)
        _set(result, status=TaskResultStatus.FAILED, finished_at=timezone.now())
        task_finished.send(sender=sender, task_result=result)
        raise
    _set(result, status=TaskResultStatus.SUCCESSFUL, finished_at=timezone.now(), _return_value=value)
    task_finished.send(sender=sender, task_result=result)
    return value


def class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _traceback(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))


def _set(result: TaskResult[Any, Any], **fields: Any) -> None:
    for name, value in fields.items():
        object.__setattr__(result, name, value)  # a frozen dataclass, which Django's backends set so too
