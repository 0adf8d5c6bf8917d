"""Recovery: the one home of acting on lost runs and lost messages.

The reaper (a thread in every worker, the beat task), the management command
and the admin all call these functions. Redis decides through the gate's
reap script; this module publishes what it hands back and records it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from celery import current_app
from django.utils import timezone

from . import records
from .connection import get_gate
from .gate import Recovery
from .messages import TaskMessage
from .statuses import Status
from .task import publish

logger = logging.getLogger(__name__)


@dataclass
class ReapReport:
    visited: int = 0
    recoveries: list[Recovery] = field(default_factory=list)

    def count(self, action: str) -> int:
        return sum(1 for r in self.recoveries if r.action == action)

    def summary(self) -> str:
        counts = ", ".join(f"{a} {self.count(a)}" for a in ("redispatch", "republish", "fail", "grant"))
        return f"visited {self.visited} due keys: {counts}"


def reap(*, dry_run: bool = False, batch: int = 500, max_batches: int = 100, app=None) -> ReapReport:
    """Recover every holder whose deadline passed; in a dry run, only report what would be done."""
    app = app or current_app
    report = ReapReport()
    for _ in range(max_batches):
        visited, found = get_gate().reap(batch=batch, dry_run=dry_run)
        report.visited += visited
        report.recoveries += found
        if not dry_run:
            for recovery in found:
                _act(app, recovery)
        if dry_run or visited < batch:
            break
    if report.recoveries:
        logger.info("keyed queue reaper %s%s", "(dry run) " if dry_run else "", report.summary())
    return report


def _act(app, recovery: Recovery) -> None:
    task_id = TaskMessage.decode(recovery.message).task_id if recovery.message else None
    if task_id is None:  # a holder without a message: nothing to publish or record
        logger.error("keyed queue holder without a message key=%r ticket=%s", recovery.key, recovery.ticket)
        return
    now = timezone.now()
    lost = f"its worker was lost: the lease of attempt {recovery.attempts} expired"
    if recovery.action == "fail":
        records.settle(task_id, Status.FAILED, finished_at=now, error=f"{lost}; no recoveries left")
        return
    if recovery.action == "redispatch":
        records.settle(task_id, Status.DISPATCHED, dispatched_at=now, error=f"{lost}; dispatched again")
    published = publish(app, recovery)
    if published and recovery.action != "redispatch":
        records.record(task_id, Status.DISPATCHED, 0, dispatched_at=now)
