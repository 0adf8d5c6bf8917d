"""The dispatcher: the only code that turns a granted ticket into a broker message or a local run.

A granted ticket's message goes out as Celery built it in the process that
sent it (``sending``), with the ticket's header added. So any process of the
project can publish a grant, whether or not it imported the task's module: a
worker finishing a task, the reaper, a management command, the admin. A worker that finished a
task may instead run its key's next grant itself (``hand_over``, see
``handoff``). Either way the task's record says it was dispatched.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.utils import timezone

from ..conf import settings
from ..exceptions import MessageRefused
from ..gate import Code, Grant, Recovery
from ..records import submissions
from ..records.statuses import Status
from ..records.transitions import Transition
from . import handoff, handoff_runs
from .messages import TaskMessage, ticket_header
from .process import current
from .sending import publish_stored

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


def record_dispatched(grant: Grant | Recovery, task_id: str, at: datetime) -> None:
    """Buffer that the granted message of ``task_id`` went out (or that this process kept it to run)."""
    dispatched = Transition(task_id, grant.key, grant.ticket, Status.DISPATCHED, 0, {"dispatched_at": at})
    current().recorder.record(dispatched)


def publish(
    app,
    grant: Grant | Recovery,
    *,
    record: bool = True,
    then: list[Grant | Recovery] | None = None,
    countdown: float = 0.0,
) -> Published:
    """Publish a granted ticket's stored message and, with ``record``, record its task dispatched;
    with ``countdown``, for then (Celery's ``eta``: a worker holds it until then, in no pool process).

    A message the broker refuses is published again by the reaper within
    ``REPUBLISH_DELAY_SECONDS`` (or, if Redis is unreachable too, the dispatch
    timeout). A stored message the app does not accept is never decoded: its
    task fails and its key moves on; the tickets granted in its place are
    appended to ``then``, or published now.
    """
    try:
        # A recovery without a message is refused too: peek's json.loads(None) raises TypeError.
        message = TaskMessage.decode(grant.message, app.conf.accept_content)  # type: ignore[arg-type]
    except MessageRefused as refused:
        granted = _fail_refused(grant, refused)
        if then is None:
            publish_grants(app, granted)
        else:
            then.extend(granted)
        return Published.MESSAGE_REFUSED
    dispatched_at = timezone.now()
    try:
        header = ticket_header(grant.key, grant.ticket, grant.dispatch)
        if countdown > 0:
            header["eta"] = (app.now() + timedelta(seconds=countdown)).isoformat()
        publish_stored(app, message, header)
    except Exception:
        logger.exception(
            "publishing %s[%s] key=%r ticket=%s failed; the reaper publishes it again",
            message.task_name,
            message.task_id,
            grant.key,
            grant.ticket,
        )
        try:
            current().gate.republish_soon(
                grant.key, grant.ticket, grant.dispatch, delay_seconds=REPUBLISH_DELAY_SECONDS
            )
        except Exception:
            logger.warning("could not bring the republish of key=%r ticket=%s forward", grant.key, grant.ticket)
        return Published.BROKER_REFUSED
    if record:
        record_dispatched(grant, message.task_id, dispatched_at)
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
    task_id = None if refused.task_id == "?" else refused.task_id  # an envelope not even JSON: the ticket's row
    return fail_ticket(grant.key, grant.ticket, task_id, str(refused))


def fail_ticket(key: str, ticket: int, task_id: str | None, error: str, *, dispatch: int | None = None) -> list[Grant]:
    """Withdraw a ticket that has not started and whose task cannot run, and record the task failed;
    the tickets granted in its place. With ``dispatch`` and ``task_id`` only that attempt of that
    task is withdrawn, else nothing (see ``Gate.cancel``); such a task failed for good, and on a key
    whose submissions block on failure its ticket blocks the key instead. ``task_id`` None: the ticket's row."""
    named = dispatch is not None
    withdrawn = current().gate.cancel(
        key, ticket, dispatch=dispatch, task_id=task_id if named else None, failed_for_good=named
    )
    if withdrawn.code is Code.BLOCKED and named:
        error += "; it blocks its key until an operator retries or cancels it"
    elif withdrawn.code is not Code.OK and named:
        return []
    failed = {"finished_at": timezone.now(), "error": error}
    submissions.settle(current().gate, task_id, key, ticket, Status.FAILED, **failed)
    return withdrawn.granted


# -- local handoff -------------------------------------------------------------


def hand_over(app, finished_request, grants: list[Grant]) -> Dispatched:
    """Dispatch what a run's finish granted: the first grant may run here, next (see ``handoff``)."""
    return publish_grants(app, _keep(app, finished_request, grants))


def _keep(app, finished_request, grants: list[Grant]) -> list[Grant]:
    """Keep the first grant to run in this process if it may; returns the grants left to publish."""
    process = current()
    state, seconds = process.handoff, settings.LOCAL_HANDOFF_SECONDS
    if not grants or seconds <= 0 or state.kept is not None:
        return grants
    if state.running and time.monotonic() >= state.deadline:
        return grants
    if any(finished_request.timelimit or ()):
        return grants  # the pool's timer of the message being run would cover the kept run too
    try:
        message = TaskMessage.decode(grants[0].message, app.conf.accept_content)
    except MessageRefused:
        return grants  # publishing refuses it too, and fails its task
    request = handoff.local_request(app, message, grants[0], finished_request.hostname, process.worker)
    if request is None:
        return grants
    state.kept = handoff.Kept(grants[0], request, after=finished_request.id)
    record_dispatched(grants[0], message.task_id, timezone.now())
    return grants[1:]


def run_kept(app, task_id: str) -> None:
    """After the run ``task_id`` is traced: run what it kept, and what those keep, within the budget.

    A kept run's own ``task_postrun`` calls this again, nested, and returns at
    once: the outermost call loops, so the stack does not grow with the chain.
    """
    process = current()
    state = process.handoff
    kept = state.kept
    if kept is None or kept.after != task_id or state.running:
        return
    state.running = True
    state.deadline = time.monotonic() + settings.LOCAL_HANDOFF_SECONDS
    try:
        while state.kept is not None:
            kept, state.kept = state.kept, None
            logger.debug("running key=%r ticket=%s here (local handoff)", kept.grant.key, kept.grant.ticket)
            state.tracing = kept
            handoff_runs.note(task_id, kept.request)  # this job's own task finished: it hosts this run
            handoff.trace(app, app.tasks[kept.request["task"]], kept.request, process.worker)
            state.tracing = None
    finally:
        handoff_runs.clear()
        state.running, state.tracing = False, None
        left, state.kept = state.kept, None
        if left is not None:  # the loop was interrupted: the grant goes out as usual
            publish_grants(app, [left.grant])


def requeue_kept(app, task_id: str, key: str, ticket: int) -> None:
    """``Reject(requeue=True)`` of a run: if this process runs it by local handoff, there is no message
    for the broker to deliver again, so its grant's message is published now, as that delivery."""
    tracing = current().handoff.tracing
    if tracing is None or (tracing.request["id"], tracing.grant.key, tracing.grant.ticket) != (task_id, key, ticket):
        return
    publish(app, tracing.grant, record=False)
