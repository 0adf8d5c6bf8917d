"""Carrying out what the gate recovered: the reaper's finds, an operator's release, a stopped run's end.

The gate's ``reap`` (and ``release``, its operator's form) decides in Redis what becomes of each
due holder; here its message is published, or its task's record says how it ended. The reaper,
the operator's actions and a worker ending a run it saw killed all come here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import DatabaseError, models
from django.db.models import Case, F, Value, When
from django.utils import timezone

from ..exceptions import MessageRefused
from ..gate import Recovery, RecoveryAction, Stopping
from ..process.state import current, worker_gate
from ..records import submissions
from ..records.models import KeyedTask
from ..records.statuses import Status
from ..records.transitions import Transition
from .dispatch import Published, give_back_pool_slot, publish
from .message import TaskMessage

if TYPE_CHECKING:
    from celery import Celery

logger = logging.getLogger(__name__)

T = TypeVar("T")


def carry_out(
    app: Celery, recovery: Recovery, reason: str = "", *, stopped_status: str = Status.FAILED, after: str = ""
) -> bool:
    """Carry out one recovery; False if its message had to be published and the broker refused it.

    ``reason``: why its run ended, for its record (default: its lease expired); ``after``: what the note of
    the attempt it ended adds (a release: that the attempt may still run). A stopped run's
    end (``recovery.stopped``) says who stopped it; its task fails (blocking its key, if its task
    does), or ends ``stopped_status`` when Celery killed it and no operator stopped it.
    """
    if recovery.action is RecoveryAction.POOL:
        return True  # it waits for its pool, which was asked again: nothing to publish yet
    if recovery.action is RecoveryAction.OUTCOME:
        # A run finished but its worker died before writing the record.
        try:
            end = Transition.from_json(recovery.message or b"{}")
        except ValueError:
            logger.error("keyed queue key=%r keeps an outcome that is not a record: %r", recovery.key, recovery.message)
            return True
        what = f"recording an outcome of key={recovery.key!r}"
        if recorded(what, KeyedTask.objects.apply_setting_aside, [end]) is not None:
            worker_gate().forget_outcomes([(recovery.key, end.outcome_field)])
        return True
    if not recovery.message:  # a holder without a message: nothing to publish or record
        logger.error("keyed queue holder without a message key=%r ticket=%s", recovery.key, recovery.ticket)
        return True
    try:
        task_name, task_id = TaskMessage.peek(recovery.message)[:2]
    except MessageRefused:
        return publish(app, recovery) is not Published.BROKER_REFUSED  # which refuses it and fails its ticket
    current().totals.count("recovered", task_name, outcome=recovery.action)
    if recovery.action in (RecoveryAction.FAIL, RecoveryAction.BLOCK):
        _end_in_pool(app, task_name, recovery)  # its ticket ended: its pool's slot goes back too
    now = timezone.now()
    lost = reason or f"its worker was lost: the lease of attempt {recovery.attempts} expired"
    settle = partial(recorded, "recording a recovery", submissions.settle, worker_gate(), task_id, recovery.key)
    if recovery.action in (RecoveryAction.FAIL, RecoveryAction.BLOCK):
        blocks = recovery.action is RecoveryAction.BLOCK
        blocked = "; it blocks its key until an operator retries or cancels it" if blocks else ""
        if recovery.stopped is not None:
            ended = f"{stopped_text(recovery.stopped)}; {reason or 'its lease expired: its process is gone'}"
            status = Status.FAILED if blocks or recovery.stopped.by else stopped_status
        else:
            ended, status = f"{lost}; no recoveries left", Status.FAILED
        failed: dict[str, Any] = {"finished_at": now, "error": f"{ended}{blocked}"}
        # What an operator's retry needs, if its row was written after the gate let the message go.
        failed["message"] = Case(
            When(message="", then=Value(recovery.message.decode())),
            default=F("message"),
            output_field=models.TextField(),
        )
        settle(recovery.ticket, status, **failed)
        _note_attempt_end(task_id, recovery, failed["error"] + after, now)
        current().totals.count("finished", task_name, outcome=status)
        return True
    if recovery.action is RecoveryAction.REDISPATCH:
        error = f"{lost}; dispatched again"
        settle(recovery.ticket, Status.DISPATCHED, dispatched_at=now, error=error)
        _note_attempt_end(task_id, recovery, error + after, now)
    # A redispatch's record was settled above; any other publish records its dispatch.
    mark_dispatched = recovery.action is not RecoveryAction.REDISPATCH
    return publish(app, recovery, mark_dispatched=mark_dispatched) is not Published.BROKER_REFUSED


def _note_attempt_end(task_id: str, recovery: Recovery, how: str, now: datetime) -> None:
    """The attempt a recovery ended, noted on its record (``note_attempt``), with its worker and start as its
    row has them, if they are that attempt's."""
    key, ticket, attempt = recovery.key, recovery.ticket, recovery.attempts
    rows = KeyedTask.objects.filter(task_id=task_id, key=key, ticket=ticket)
    row = recorded("reading a recovered attempt", rows.values_list("attempts", "worker", "started_at").first)
    ran = (row[1], row[2]) if row is not None and row[0] == attempt and row[2] is not None else None
    recorded("noting a recovered attempt", KeyedTask.objects.note_attempt, task_id, key, ticket, attempt, how, now, ran)


def _end_in_pool(app: Celery, task_name: str, recovery: Recovery) -> None:
    """A recovered ticket of a pooled task ended for good (stopped, killed, or out of recoveries): its pool
    slot goes back now, as a finish gives it back, not at the end of its hold (a full pool's waiting tasks
    waited a lease). A ticket dispatched again keeps it, as a retry keeps its key's place: its next attempt
    may hold it or wait for it already (the gate pushed its message in the recovery's own call), and
    giving it back would free that attempt's slot or drop it from its pool's line."""
    pool = getattr(app.tasks.get(task_name), "serial_pool", None)
    if isinstance(pool, str):
        give_back_pool_slot(app, pool, recovery.key, recovery.ticket)


def stopped_text(stopping: Stopping) -> str:
    """How a stopped run's record says it was stopped: by whom and how, or why Celery killed it."""
    return f"stopped by {stopping.by} ({stopping.how})" if stopping.by else stopping.how


def recorded(what: str, write: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
    """``write(...)``, a write of records; if the database fails, None, logged: the recovery of keys goes on."""
    try:
        return write(*args, **kwargs)
    except DatabaseError:
        logger.warning("keyed queue reaper: %s failed; recovering keys goes on", what, exc_info=True)
        return None
