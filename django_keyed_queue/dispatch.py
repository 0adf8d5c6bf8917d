"""The only code that publishes a keyed task's message to the broker.

Messages go out by task name, with the options stored at submission (the
task's own routing, serializer, time limits and the caller's options), as
``app.send_task`` sends them. So any process of the project can publish a
grant, whether or not it imported the task's module: a worker finishing a
task, the reaper, a management command, the admin.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from django.utils import timezone

from . import records
from .connection import get_gate
from .exceptions import MessageRefused
from .gate import Grant, Recovery
from .messages import TaskMessage, ticket_header
from .statuses import Status

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


class Published(enum.Enum):
    SENT = "sent"
    #: The broker refused it: the reaper publishes it again.
    BROKER_REFUSED = "broker refused"
    #: Its stored message is not one the app accepts: the task failed, its key moved on.
    MESSAGE_REFUSED = "message refused"


@dataclass
class Dispatched:
    """What publishing some grants did."""

    published: int = 0
    #: Refused by the broker: the reaper publishes them again.
    failed: int = 0
    #: Stored messages the app does not accept: those tasks failed.
    refused: int = 0

    def add(self, outcome: Published) -> None:
        if outcome is Published.SENT:
            self.published += 1
        elif outcome is Published.BROKER_REFUSED:
            self.failed += 1
        else:
            self.refused += 1

    def __str__(self) -> str:
        text = f"{self.published} dispatched"
        if self.failed:
            text = (
                f"{self.published} of {self.published + self.failed} dispatched; the broker refused {self.failed} "
                f"(see the log), which the reaper publishes again within seconds"
            )
        if self.refused:
            text += f"; {self.refused} failed: their stored message is not one the app accepts (see the log)"
        return text


def publish(app, grant: Grant | Recovery, *, record: bool = True, then: list[Grant] | None = None) -> Published:
    """Publish a granted ticket's stored message and, with ``record``, record its task dispatched.

    A message the broker refuses is published again by the reaper within
    ``REPUBLISH_DELAY_SECONDS`` (or, if Redis is unreachable too, the dispatch
    timeout). A stored message the app does not accept is never decoded: its
    task fails and its key moves on; the tickets granted in its place are
    appended to ``then``, or published now.
    """
    try:
        message = TaskMessage.decode(grant.message, app.conf.accept_content)
    except MessageRefused as refused:
        granted = _fail_refused(grant, refused)
        if then is None:
            publish_grants(app, granted)
        else:
            then.extend(granted)
        return Published.MESSAGE_REFUSED
    dispatched_at = timezone.now()
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
        return Published.BROKER_REFUSED
    if record:
        records.record_dispatched(message.task_id, dispatched_at)
    return Published.SENT


def publish_grants(app, grants: Iterable[Grant | Recovery]) -> Dispatched:
    """Publish the messages of tickets the gate just granted and record them dispatched."""
    done = Dispatched()
    pending = list(grants)
    while pending:
        done.add(publish(app, pending.pop(0), then=pending))
    return done


def _fail_refused(grant: Grant | Recovery, refused: MessageRefused) -> list[Grant]:
    """Withdraw a ticket whose stored message is refused and fail its task; the tickets granted in its place."""
    logger.error("keyed queue key=%r ticket=%s: %s; the task fails", grant.key, grant.ticket, refused)
    withdrawn = get_gate().cancel(grant.key, grant.ticket)
    if refused.task_id != "?":
        records.settle(refused.task_id, Status.FAILED, finished_at=timezone.now(), error=str(refused))
    return withdrawn.granted
