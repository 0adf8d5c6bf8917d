"""Rebuild: restore the gate from the records after its Redis lost everything (``keyed_queue_rebuild``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from celery import Celery
from django.db import models
from django.utils import timezone

from ..exceptions import ActionRefused
from ..messaging.dispatch import Published, publish
from ..process.state import get_gate
from ..records import submissions
from ..records.models import KeyedTask
from ..records.statuses import Status
from .lookup import celery_app, serial_limit, stored_message

logger = logging.getLogger("django_keyed_queue.ops.recovery")


@dataclass
class RebuildReport:
    restored: dict[str, int] = field(default_factory=dict)  # key -> tickets restored
    skipped: list[str] = field(default_factory=list)  # keys live in Redis, left alone
    unrecoverable: list[str] = field(default_factory=list)  # task ids with no stored message of their own
    unpublished: list[str] = field(default_factory=list)  # task ids granted whose publish failed

    def summary(self) -> str:
        failed = f"; {len(self.unpublished)} granted tasks could not be published" if self.unpublished else ""
        return (
            f"restored {sum(self.restored.values())} tasks over {len(self.restored)} keys; "
            f"skipped {len(self.skipped)} live keys; "
            f"{len(self.unrecoverable)} tasks without a stored message of their own{failed}"
        )


def rebuild(*, dry_run: bool = False, app: Celery | None = None) -> RebuildReport:
    """Restore the gate from the records after Redis lost it: every unfinished task runs, in ticket order.

    Keys that still have state in Redis are left alone. A task that was
    running when Redis was lost runs again (fence its writes with its token).
    Delayed tasks not yet due are on the broker and join when due.
    """
    app = celery_app(app)
    report = RebuildReport()
    gate = get_gate()
    if not dry_run:  # a dry run writes nothing: what Redis keeps of a key, it keeps live, and that key is skipped
        submissions.write_due(gate)  # what this Redis still keeps (after a total loss, nothing)
    active = KeyedTask.objects.active().filter(ticket__isnull=False).order_by("key", "ticket")
    by_key: dict[str, list] = {}
    for row in active.only("pk", "task_id", "task_name", "key", "ticket", "message"):
        by_key.setdefault(row.key, []).append(row)
    live = gate.keys_with_state(list(by_key)) if dry_run else set()
    for key, rows in by_key.items():
        restorable = [r for r in rows if _restorable(r, app)]
        kept = {r.pk for r in restorable}
        report.unrecoverable += [r.task_id for r in rows if r.pk not in kept]
        waiting = [(r.ticket, r.message.encode()) for r in restorable]
        if not waiting:
            continue
        if dry_run:  # as the real run finds it: a key with state in Redis is refused by the gate
            if key in live:
                report.skipped.append(key)
            else:
                report.restored[key] = len(waiting)
            continue
        last_ticket = KeyedTask.objects.for_key(key).aggregate(models.Max("ticket"))["ticket__max"]
        limit = serial_limit(app, rows[0].task_name)
        rebuilt = gate.rebuild(key, last_ticket=last_ticket, waiting=waiting, limit=limit)
        if not rebuilt.ok:
            report.skipped.append(key)
            continue
        report.restored[key] = len(waiting)
        KeyedTask.objects.settle_rows(
            [r.pk for r in restorable], Status.WAITING, error="rebuilt after the gate's Redis was lost"
        )
        task_ids = {r.ticket: r.task_id for r in rows}
        for grant in rebuilt.granted:
            task_id = task_ids[grant.ticket]
            published = publish(app, grant, mark_dispatched=False)
            if published is Published.BROKER_REFUSED:
                report.unpublished.append(task_id)
            elif published is Published.SENT:
                KeyedTask.objects.settle(task_id, key, grant.ticket, Status.DISPATCHED, dispatched_at=timezone.now())
    logger.info("keyed queue rebuild %s%s", "(dry run) " if dry_run else "", report.summary())
    return report


def _restorable(row: KeyedTask, app) -> bool:
    """Whether ``row`` has a stored message of its own to restore (see ``stored_message``)."""
    try:
        stored_message(row, app)
    except ActionRefused as refused:
        logger.error("keyed queue rebuild: task %s key=%r is not restored: %s", row.task_id, row.key, refused)
        return False
    return True
