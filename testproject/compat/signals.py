"""Receivers of Celery's task signals that note, in the journal, each one fired for a compat task.

Connected in every process of the project (``CompatConfig.ready``): the test's
(where ``apply_async`` publishes) and the workers' main and child processes.
"""

from __future__ import annotations

import os

from celery.signals import (
    after_task_publish,
    before_task_publish,
    task_failure,
    task_postrun,
    task_prerun,
    task_received,
    task_retry,
    task_revoked,
    task_success,
)

from . import journal

PREFIX = "compat."


def _name(sender) -> str:
    return sender if isinstance(sender, str) else getattr(sender, "name", "") or ""


def _note(signal: str, sender, task_id: str | None, **fields: object) -> None:
    if _name(sender).startswith(PREFIX):
        journal.note(f"signal:{signal}", name=_name(sender), id=task_id, **fields)


@before_task_publish.connect
def _before_publish(sender=None, headers=None, **_: object) -> None:
    _note("before_task_publish", sender, (headers or {}).get("id"))
    if headers is not None and _name(sender).startswith(PREFIX):
        # As tracing does: a header of the publisher's own, which the task's request carries.
        headers["compat_published_by"] = os.getpid()


@after_task_publish.connect
def _after_publish(sender=None, headers=None, **_: object) -> None:
    _note("after_task_publish", sender, (headers or {}).get("id"))


@task_received.connect
def _received(sender=None, request=None, **_: object) -> None:
    # The sender is the consumer; the request names the task, and holds the representations
    # of the arguments that the worker's "received" log record and its task-received event carry.
    if request is not None:
        _note("task_received", request.name, request.id, argsrepr=request.argsrepr, kwargsrepr=request.kwargsrepr)


@task_prerun.connect
def _prerun(sender=None, task_id=None, **_: object) -> None:
    _note("task_prerun", sender, task_id)


@task_postrun.connect
def _postrun(sender=None, task_id=None, state=None, **_: object) -> None:
    _note("task_postrun", sender, task_id, state=state)


@task_success.connect
def _success(sender=None, result=None, **_: object) -> None:
    _note("task_success", sender, sender.request.id, result=result)


@task_failure.connect
def _failure(sender=None, task_id=None, exception=None, **_: object) -> None:
    _note("task_failure", sender, task_id, exception=repr(exception))


@task_retry.connect
def _retry(sender=None, request=None, reason=None, **_: object) -> None:
    _note("task_retry", sender, getattr(request, "id", None), reason=repr(reason))


@task_revoked.connect
def _revoked(sender=None, request=None, terminated=False, expired=False, **_: object) -> None:
    _note("task_revoked", sender, getattr(request, "id", None), terminated=terminated, expired=expired)
