"""The dispatcher: publishes the tickets the gate grants after their submission, and records them dispatched.

A granted ticket's message goes out as Celery built it in the process that
sent it (``building.publish_stored``), with the ticket's header added. So any
process of the project can publish a grant, whether or not it imported the
task's module: a worker finishing a task, the reaper, a management command,
the admin. Two grants go out elsewhere: a submission granted at once is
published by its producer (``producer.submit``, through ``publish_stored``
too), and a worker that finished a task may run its key's next grant itself
(``worker.handoff``). Either way the task's record says it was dispatched.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import redis
from django.utils import timezone

from ..conf import settings
from ..exceptions import MessageRefused
from ..gate import Cancel, Code, Grant, Recovery
from ..process.outage import outlast_restart
from ..process.state import current, worker_gate
from ..records import submissions
from ..records.statuses import Status
from ..records.transitions import Transition
from .building import publish_stored
from .message import TaskMessage, sent_eta, ticket_header

if TYPE_CHECKING:
    from celery import Celery

logger = logging.getLogger(__name__)

#: A grant whose publish failed is published again by the reaper after this long.
REPUBLISH_DELAY_SECONDS = 2.0


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
    broker_refused: int = 0
    #: Stored messages the app does not accept: those tasks failed.
    message_refused: int = 0

    def add(self, outcome: Published) -> None:
        if outcome is Published.SENT:
            self.published += 1
        elif outcome is Published.BROKER_REFUSED:
            self.broker_refused += 1
        else:
            self.message_refused += 1

    def __str__(self) -> str:
        text = f"{self.published} dispatched"
        if self.broker_refused:
            text = (
                f"{self.published} of {self.published + self.broker_refused} dispatched; the broker refused "
                f"{self.broker_refused} (see the log), which the reaper publishes again within seconds"
            )
        if self.message_refused:
            text += f"; {self.message_refused} failed: their stored message is not one the app accepts (see the log)"
        return text


def record_dispatched(grant: Grant | Recovery, task_id: str, at: datetime) -> None:
    """Buffer that the granted message of ``task_id`` went out (or that this process kept it to run)."""
    # Its row is written by a writer's pass only past the record delay (or by its run, in its final
    # state): this is not tried before then, unless this process runs it and its run makes the row.
    dispatched = Transition(
        task_id, grant.key, grant.ticket, Status.DISPATCHED, 0, {"dispatched_at": at},
        not_before=time.monotonic() + settings.RECORD_DELAY_SECONDS,
    )  # fmt: skip
    current().recorder.buffer(dispatched)


def publish(
    app: Celery,
    grant: Grant | Recovery,
    *,
    mark_dispatched: bool = True,
    then: list[Grant | Recovery] | None = None,
    countdown: float = 0.0,
    at_once: bool = False,
) -> Published:
    """Publish a granted ticket's stored message and, with ``mark_dispatched``, record its task dispatched;
    with ``countdown``, for then (Celery's ``eta``: a worker holds it until then, in no child process);
    ``at_once``, without the eta it was sent with (an operator's Run now). A message that keeps an eta
    (a debounce's) is published again by the reaper only past it, if it is lost.

    A message the broker refuses is published again by the reaper within
    ``REPUBLISH_DELAY_SECONDS`` (or, if Redis is unreachable too, the dispatch
    timeout). A stored message the app does not accept is never decoded: its
    task fails and its key moves on; the tickets granted in its place are
    appended to ``then``, or published now.
    """
    if grant.pushed and countdown <= 0 and not at_once:
        # The gate pushed it onto the broker's queue as it granted it: only the record is left.
        try:
            task_id = TaskMessage.peek(grant.message)[1]  # type: ignore[arg-type]  # a grant's message
        except MessageRefused:
            pass  # below, its task fails and its ticket is withdrawn: the pushed copy cannot start
        else:
            if mark_dispatched:
                record_dispatched(grant, task_id, timezone.now())
            return Published.SENT
    try:
        # A recovery without a message is refused too: peek's json.loads(None) raises TypeError.
        message = TaskMessage.decode(grant.message, current().worker.accepted(app))  # type: ignore[arg-type]
    except MessageRefused as refused:
        granted = _fail_refused(grant, refused)
        if then is None:
            publish_grants(app, granted)
        else:
            then.extend(granted)
        return Published.MESSAGE_REFUSED
    dispatched_at = timezone.now()
    if not _sent(app, grant, message, countdown=countdown, at_once=at_once):
        return Published.BROKER_REFUSED
    if mark_dispatched:
        record_dispatched(grant, message.task_id, dispatched_at)
    eta = None if countdown > 0 or at_once else sent_eta(message)
    if eta is not None and eta > dispatched_at:
        _deadline_from_eta(grant, (eta - dispatched_at).total_seconds())
    return Published.SENT


def _sent(app: Celery, grant: Grant | Recovery, message: TaskMessage, *, countdown: float, at_once: bool) -> bool:
    """Publish ``message`` with its grant's header (for ``countdown`` seconds on, or without its eta); if the
    broker refuses it, the reaper is asked to publish it again within ``REPUBLISH_DELAY_SECONDS``."""
    try:
        header = ticket_header(grant.key, grant.ticket, grant.dispatch)
        if countdown > 0:
            header["eta"] = (app.now() + timedelta(seconds=countdown)).isoformat()
        elif at_once:
            header["eta"] = None
        publish_stored(app, message, header)
        return True
    except Exception:
        logger.exception(
            "publishing %s[%s] key=%r ticket=%s failed; the reaper publishes it again",
            message.task_name, message.task_id, grant.key, grant.ticket,
        )  # fmt: skip
    try:
        worker_gate().republish_soon(grant.key, grant.ticket, grant.dispatch, delay_seconds=REPUBLISH_DELAY_SECONDS)
    except Exception:
        logger.warning("could not bring the republish of key=%r ticket=%s forward", grant.key, grant.ticket)
    return False


def _deadline_from_eta(grant: Grant | Recovery, eta_in_seconds: float) -> None:
    """A message published with an eta: its dispatch deadline runs from then, as the submission of a
    debounced task set it, so that the reaper publishes no copy before it is due."""
    wait = eta_in_seconds + worker_gate().dispatch_timeout_ms / 1000
    try:
        worker_gate().republish_after(grant.key, grant.ticket, grant.dispatch, delay_seconds=wait)
    except Exception:
        logger.warning("key=%r ticket=%s may be published again before its eta", grant.key, grant.ticket)


def publish_grants(app: Celery, grants: Iterable[Grant | Recovery]) -> Dispatched:
    """Publish the messages of tickets the gate just granted and record them dispatched."""
    done = Dispatched()
    pending = list(grants)
    while pending:
        done.add(publish(app, pending.pop(0), then=pending))
    return done


def give_back_pool_slot(app: Celery, pool: str, key: str, ticket: int) -> None:
    """A run of ``pool`` ended for good, by any end (its finish, a retry going out, a stopped or killed run's
    end, a lost run out of recoveries): give its slot back and publish the ticket that takes it. If Redis cannot be
    reached, the slot returns by the end of its hold (a lease, and a margin)."""
    try:
        granted, _ = outlast_restart(lambda: worker_gate().pool_release(pool, [(key, ticket)]))
    except redis.RedisError:
        logger.warning("giving back the slot of pool %r of key=%r ticket=%s failed; it returns at its lease's end",
                       pool, key, ticket, exc_info=True)  # fmt: skip
        return
    publish_grants(app, granted)


def _fail_refused(grant: Grant | Recovery, refused: MessageRefused) -> list[Grant]:
    """Withdraw a ticket whose stored message is refused and fail its task; the tickets granted in its place."""
    logger.error("keyed queue key=%r ticket=%s: %s; the task fails", grant.key, grant.ticket, refused)
    task_id = None if refused.task_id == "?" else refused.task_id  # an envelope not even JSON: the ticket's row
    return fail_ticket(grant.key, grant.ticket, task_id, str(refused))


def fail_ticket(key: str, ticket: int, task_id: str | None, error: str, *, dispatch: int | None = None) -> list[Grant]:
    """Withdraw a ticket that has not started and whose task cannot run, and record the task failed;
    the tickets granted in its place. With ``dispatch`` and ``task_id`` only that attempt of that
    task is withdrawn, else nothing (see ``Gate.cancel``); such a task failed for good, and on a key
    whose submissions block on failure its ticket blocks the key instead. ``task_id`` None: the ticket's row."""
    named = dispatch is not None
    withdrawn = worker_gate().cancel(
        Cancel(key, ticket, dispatch=dispatch, task_id=task_id if named and task_id else "", failed_for_good=named)
    )
    if withdrawn.code is Code.BLOCKED and named:
        error += "; it blocks its key until an operator retries or cancels it"
    elif withdrawn.code is not Code.OK and named:
        return []
    failed: dict[str, Any] = {"finished_at": timezone.now(), "error": error}
    submissions.settle(worker_gate(), task_id, key, ticket, Status.FAILED, **failed)
    return withdrawn.granted
