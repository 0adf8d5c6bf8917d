"""Django's tasks framework, wherever it comes from: ``django.tasks`` (Django 6.0+), else the
``django-tasks`` backport (``pip install django-keyed-queue[tasks]``, Django 4.2 and 5.2), whose
API is the same under another package name."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.core.exceptions import ImproperlyConfigured

if TYPE_CHECKING:
    from django.tasks import DEFAULT_TASK_QUEUE_NAME, Task, TaskContext, TaskResult, TaskResultStatus
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import DEFAULT_TASK_PRIORITY, TASK_MAX_PRIORITY, TASK_MIN_PRIORITY, TaskError
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist, TaskResultMismatch
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json
else:
    try:
        from django.tasks import DEFAULT_TASK_QUEUE_NAME, Task, TaskContext, TaskResult, TaskResultStatus
        from django.tasks.backends.base import BaseTaskBackend
        from django.tasks.base import DEFAULT_TASK_PRIORITY, TASK_MAX_PRIORITY, TASK_MIN_PRIORITY, TaskError
        from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist, TaskResultMismatch
        from django.tasks.signals import task_enqueued, task_finished, task_started
        from django.utils.json import normalize_json
    except ImportError:
        try:
            from django_tasks import DEFAULT_TASK_QUEUE_NAME, TaskContext, TaskResult, TaskResultStatus
            from django_tasks.backends.base import BaseTaskBackend
            from django_tasks.base import DEFAULT_TASK_PRIORITY, TASK_MAX_PRIORITY, TASK_MIN_PRIORITY, Task, TaskError
            from django_tasks.exceptions import InvalidTaskError as InvalidTask
            from django_tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch
            from django_tasks.signals import task_enqueued, task_finished, task_started
            from django_tasks.utils import normalize_json
        except ImportError as exc:
            raise ImproperlyConfigured(
                "django_keyed_queue.tasks_backend needs Django's tasks framework: Django 6.0 or later, or the "
                "django-tasks backport on Django 4.2 and 5.2 (pip install 'django-keyed-queue[tasks]')"
            ) from exc

__all__ = [
    "DEFAULT_TASK_PRIORITY",
    "DEFAULT_TASK_QUEUE_NAME",
    "TASK_MAX_PRIORITY",
    "TASK_MIN_PRIORITY",
    "BaseTaskBackend",
    "InvalidTask",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultMismatch",
    "TaskResultStatus",
    "normalize_json",
    "task_enqueued",
    "task_finished",
    "task_started",
]
