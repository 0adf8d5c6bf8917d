"""Django tasks (``@task``, Django's tasks framework) of the user's project, run by ``CeleryBackend``.

Appended to ``shop/tasks.py`` by the tests that use them (tests/userproject/test_django_tasks.py),
below the project's Celery tasks, whose ``log`` they use: Celery's ``autodiscover_tasks()`` finds them
there. On Django 4.2 and 5.2 the framework is the django-tasks backport.
"""

# ruff: noqa: F821  (``log`` and ``logged`` are files/tasks.py's, above these in shop/tasks.py)

import time

from django.conf import settings

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task


@task(key="{key}", takes_context=True)
def django_step(context, key: str, n: int, seconds: float = 0.0) -> dict:
    """A keyed Django task: logs its start and end, with its attempt; returns what it did."""
    log("start", key, n, context.task_result.id, attempt=context.attempt)
    time.sleep(seconds)
    log("end", key, n, context.task_result.id)
    return {"key": key, "n": n}


@task
def django_plain(key: str, n: int, seconds: float = 0.0) -> int:
    """A Django task without a key: a plain Celery task."""
    from celery import current_task

    return logged(current_task.request.id, key, n, seconds)


@task(key="{key}", takes_context=True)
def django_held(context, key: str, n: int) -> str:
    """Runs until the file ``release-<key>`` is in the project (at most 60 s), holding its key."""
    log("start", key, n, context.task_result.id)
    deadline = time.time() + 60
    while not (settings.BASE_DIR / f"release-{key}").exists() and time.time() < deadline:
        time.sleep(0.05)
    log("end", key, n, context.task_result.id)
    return "released"


class Declined(Exception):
    pass


@task(key="{key}")
def django_failing(key: str, n: int) -> None:
    raise Declined(f"step {n} of {key} declined")
