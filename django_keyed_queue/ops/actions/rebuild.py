"""Rebuild: restore the gate from the records after its Redis lost everything (``keyed_queue_rebuild``).

One plan (``plan``) says what becomes of each key; the dry run prints it, the real run carries out
the same plan. For each key, its records' unfinished tasks that hold a ticket:

- those the gate still keeps (it has their message) are left as they are;
- a task that was running (``running`` or ``retrying``) when Redis was lost may have ended since,
  or may still run: its end cannot be ruled out, so it is not run again but marked lost (failed,
  saying so), unless the operator asks for it (``rerun_running``: it is restored with the others).
  A lost task whose task blocks its key on failure holds its key back: nothing of the key is
  restored, and the report says how to go on;
- the others (waiting, or dispatched: their message may be gone with the broker) are restored, in
  ticket order: into a key with no state, as they were (their tickets kept); into a key that took
  submissions since the loss, after its holders and before its waiting tasks
  (``Gate.restore_ahead``), whose tickets are numbered after them;
- a task with no stored message of its own cannot be restored: reported (the command exits 1).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from celery import Celery
from django.db import models
from django.utils import timezone

from ...exceptions import ActionRefused
from ...messaging.dispatch import Published, publish
from ...process.state import operator_gate
from ...records import submissions
from ...records.models import KeyedTask
from ...records.statuses import Status
from . import AUDIT_LOGGER
from .lookup import celery_app, registered_task, serial_limit, stored_message

logger = logging.getLogger(AUDIT_LOGGER)

#: Statuses of a run that may have been executing when Redis was lost.
RAN = (Status.RUNNING, Status.RETRYING)
LOST_ERROR = (
    "lost with the gate's Redis while it ran (attempt {attempts}): it may have ended, or may still run, so it "
    "is not run again; retry it once you know it did not finish"
)
RESTORED_ERROR = "rebuilt after the gate's Redis was lost"


@dataclass
class KeyPlan:
    """What a rebuild does to one key."""

    key: str
    #: The key has state in Redis: it took submissions since the loss (or lost nothing).
    live: bool
    #: Restored, in ticket order.
    restore: list[KeyedTask] = field(default_factory=list)
    #: Running at the loss, not in the gate: marked lost (with ``rerun_running``, restored instead).
    lost: list[KeyedTask] = field(default_factory=list)
    #: No stored message of their own: not restored.
    unrecoverable: list[KeyedTask] = field(default_factory=list)
    #: How many of its unfinished tasks the gate still keeps (left as they are).
    kept: int = 0
    #: A lost task whose task blocks its key on failure: nothing of the key is restored.
    blocked_by: KeyedTask | None = None


@dataclass
class RebuildReport:
    keys: list[KeyPlan] = field(default_factory=list)
    rerun_running: bool = False
    #: Unfinished tasks the gate still keeps, over every key (left as they are).
    kept: int = 0
    unpublished: list[str] = field(default_factory=list)  # task ids granted whose publish failed
    failed: list[str] = field(default_factory=list)  # keys whose restore raised (logged)

    @property
    def restored(self) -> dict[str, int]:
        return {p.key: len(p.restore) for p in self.keys if p.restore and p.blocked_by is None}

    @property
    def unrecoverable(self) -> list[str]:
        return [row.task_id for p in self.keys for row in p.unrecoverable]

    def lines(self, dry_run: bool) -> list[str]:
        """What it does (or would do) to each key, as the command prints it."""
        said = []
        for p in self.keys:
            where = " after its holders, before the tasks submitted since" if p.live else ""
            if p.blocked_by is not None:
                said.append(
                    f"key={p.key!r} not restored: {p.blocked_by.task_name}[{p.blocked_by.task_id}] was running "
                    "when Redis was lost and its task blocks its key on failure; run keyed_queue_rebuild "
                    "--rerun-running to run it again first, knowing it may have ended"
                )
            elif p.restore:
                tasks = f"{len(p.restore)} task{'' if len(p.restore) == 1 else 's'}"
                said.append(f"{'would restore' if dry_run else 'restored'} {tasks} of key={p.key!r}{where}")
            for row in [] if p.blocked_by is not None else p.lost:
                said.append(f"{'would mark' if dry_run else 'marked'} task {row.task_id} of key={p.key!r} lost: "
                            "it was running when Redis was lost, and is not run again")  # fmt: skip
        return said

    def summary(self) -> str:
        lost = sum(len(p.lost) for p in self.keys if p.blocked_by is None)
        blocked = sum(p.blocked_by is not None for p in self.keys)
        failed = f"; {len(self.unpublished)} granted tasks could not be published" if self.unpublished else ""
        failed += f"; {len(self.failed)} keys could not be restored (see the log)" if self.failed else ""
        return (
            f"restored {sum(self.restored.values())} tasks over {len(self.restored)} keys; "
            f"{lost} running at the loss marked lost; {blocked} keys held back by one; "
            f"{self.kept} tasks the gate still keeps left as they are; "
            f"{len(self.unrecoverable)} tasks without a stored message of their own{failed}"
        )


def plan(*, rerun_running: bool = False, app: Celery | None = None) -> RebuildReport:
    """What a rebuild does now to each key with unfinished tasks; reads only."""
    app = celery_app(app)
    gate = operator_gate()
    active = KeyedTask.objects.active().filter(ticket__isnull=False).order_by("key", "ticket", "enqueued_at")
    by_key: dict[str, list[KeyedTask]] = {}
    fields = ("pk", "task_id", "task_name", "key", "ticket", "status", "attempts", "message")
    for row in active.only(*fields):
        by_key.setdefault(row.key, []).append(row)
    live = gate.keys_with_state(list(by_key))
    report = RebuildReport(rerun_running=rerun_running)
    for key, rows in by_key.items():
        held = gate.held_task_ids(key) if key in live else set()
        key_plan = KeyPlan(key, live=key in live, kept=sum(r.task_id in held for r in rows))
        for row in (r for r in rows if r.task_id not in held):
            if not _restorable(row, app):
                key_plan.unrecoverable.append(row)
            elif row.status in RAN and not rerun_running:
                key_plan.lost.append(row)
            else:
                key_plan.restore.append(row)
        blocking = [r for r in key_plan.lost if getattr(registered_task(app, r.task_name), "blocks_on_failure", False)]
        key_plan.blocked_by = blocking[0] if blocking else None
        report.kept += key_plan.kept
        if key_plan.restore or key_plan.lost or key_plan.unrecoverable:
            report.keys.append(key_plan)
    return report


def rebuild(*, dry_run: bool = False, rerun_running: bool = False, app: Celery | None = None) -> RebuildReport:
    """Restore the gate from the records after Redis lost it, as ``plan`` says; in a dry run, only the plan.

    Delayed tasks not yet due are on the broker and join when due.
    """
    app = celery_app(app)
    if not dry_run:  # a dry run writes nothing; what Redis keeps it keeps live, and those tasks are kept
        submissions.write_due(operator_gate())  # what this Redis still keeps (after a total loss, nothing)
    report = plan(rerun_running=rerun_running, app=app)
    if not dry_run:
        for key_plan in report.keys:
            try:  # one key that cannot be restored is reported; the others go on
                _carry_out(app, key_plan, report)
            except Exception:
                logger.exception(
                    "keyed queue rebuild: key=%r could not be restored; run the rebuild again", key_plan.key
                )
                report.failed.append(key_plan.key)
    logger.info("keyed queue rebuild %s%s", "(dry run) " if dry_run else "", report.summary())
    return report


def _carry_out(app: Celery, key_plan: KeyPlan, report: RebuildReport) -> None:
    if key_plan.blocked_by is not None:
        return
    for row in key_plan.lost:
        error = LOST_ERROR.format(attempts=row.attempts)
        KeyedTask.objects.settle_rows([row.pk], Status.FAILED, finished_at=timezone.now(), error=error)
    if not key_plan.restore:
        return
    gate, key, rows = operator_gate(), key_plan.key, key_plan.restore
    limit = serial_limit(app, rows[0].task_name)
    if key_plan.live:
        ahead = gate.restore_ahead(key, messages=[r.message.encode() for r in rows], limit=limit)
        if not ahead.ok:  # it drained meanwhile: restored as a key with no state, next time
            logger.warning("keyed queue rebuild: key=%r drained meanwhile; run the rebuild again", key)
            return
        # The tasks submitted since the loss that waited took new tickets after the restored ones.
        waited = gate.task_ids_at(key, list(ahead.renumbered.values()))
        KeyedTask.objects.renumber(
            key, {(waited[new], old): new for old, new in ahead.renumbered.items() if new in waited}
        )
        for row, ticket in zip(rows, ahead.tickets, strict=True):
            KeyedTask.objects.settle_rows([row.pk], Status.WAITING, ticket=ticket, error=RESTORED_ERROR)
        tickets = {**dict(zip(ahead.tickets, (r.task_id for r in rows), strict=True)), **waited}
        granted = ahead.granted
    else:
        last_ticket = KeyedTask.objects.for_key(key).aggregate(models.Max("ticket"))["ticket__max"]
        waiting = [(r.ticket, r.message.encode()) for r in rows if r.ticket is not None]
        rebuilt = gate.rebuild(key, last_ticket=last_ticket, waiting=waiting, limit=limit)
        if not rebuilt.ok:  # it took a submission meanwhile: restored ahead of it, next time
            logger.warning("keyed queue rebuild: key=%r took a submission meanwhile; run the rebuild again", key)
            return
        KeyedTask.objects.settle_rows([r.pk for r in rows], Status.WAITING, error=RESTORED_ERROR)
        tickets = {r.ticket: r.task_id for r in rows if r.ticket is not None}
        granted = rebuilt.granted
    for grant in granted:
        task_id = tickets.get(grant.ticket)
        published = publish(app, grant, mark_dispatched=False)
        if published is Published.BROKER_REFUSED and task_id is not None:
            report.unpublished.append(task_id)
        elif published is Published.SENT and task_id is not None:
            KeyedTask.objects.settle(task_id, key, grant.ticket, Status.DISPATCHED, dispatched_at=timezone.now())


def _restorable(row: KeyedTask, app) -> bool:
    """Whether ``row`` has a stored message of its own to restore (see ``stored_message``)."""
    try:
        stored_message(row, app)
    except ActionRefused as refused:
        logger.error("keyed queue rebuild: task %s key=%r is not restored: %s", row.task_id, row.key, refused)
        return False
    return True
