"""The only code that publishes a keyed task's message to the broker.

Messages go out by task name, with the options stored at submission (the
task's own routing, serializer, time limits and the caller's options), as
``app.send_task`` sends them. So any process of the project can publish a
grant, whether or not it imported the task's module: a worker finishing a
task, the reaper, a management command, the admin.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from django.utils import timezone

from . import records
from .connection import get_gate
from .gate import Grant, Recovery
from .messages import TaskMessage, ticket_header

logger = logging.getLogger(__name__)

#: A grant whose publish failed is published again by the reaper after this long.
REPUBLISH_DELAY_SECONDS = 2.0


def send(app, message: TaskMessage, key: str, ticket: int, dispatch: int, *, task=None, **extra):
    """Publish ``message`` carrying ticket ``ticket`` of ``key``; the task's AsyncResult.

    ``task`` is the task object when the caller has it (a submission, a retry):
    its result class and routers see it, as with ``Task.apply_async``.
    ``extra`` options apply to this publish only.
    """
    options = {**message.options, **extra}
    options.pop("task_id", None)
    headers = {**(options.pop("headers", None) or {}), **ticket_header(key, ticket, dispatch)}
    if task is not None:
        options.update(result_cls=task.AsyncResult, task_type=task)
    return app.send_task(
        message.task_name, message.args, message.kwargs, task_id=message.task_id, headers=headers, **options
    )


def publish(app, grant: Grant | Recovery) -> str | None:
    """Publish a granted ticket's stored message; its task id, or None if the broker refused it.

    A refused message is published again by the reaper within
    ``REPUBLISH_DELAY_SECONDS`` (or, if Redis is unreachable too, the
    dispatch timeout).
    """
    message = TaskMessage.decode(grant.message)
    try:
        # On the gate's behalf: not a child of whatever task this process runs now.
        send(app, message, grant.key, grant.ticket, grant.dispatch, add_to_parent=False)
    except Exception:
        logger.exception(
            "publishing %s[%s] key=%r ticket=%s failed; the reaper publishes it again",
            message.task_name,
            message.task_id,
            grant.key,
            grant.ticket,
        )
        try:
            get_gate().republish_soon(grant.key, grant.ticket, grant.dispatch, delay_seconds=REPUBLISH_DELAY_SECONDS)
        except Exception:
            logger.warning("could not bring the republish of key=%r ticket=%s forward", grant.key, grant.ticket)
        return None
    return message.task_id


def publish_grants(app, grants: Iterable[Grant | Recovery]) -> list[Grant | Recovery]:
    """Publish the messages of tickets the gate just granted and record them dispatched.

    Returns the grants whose publish failed (the reaper publishes them again).
    """
    failed = []
    for grant in grants:
        dispatched_at = timezone.now()
        task_id = publish(app, grant)
        if task_id is None:
            failed.append(grant)
        else:
            records.record_dispatched(task_id, dispatched_at)
    return failed
