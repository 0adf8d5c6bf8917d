"""Helpers for a project's tests of code that submits keyed tasks (see docs/testing.md)."""

from __future__ import annotations

import time

from .process.state import get_gate
from .records import submissions
from .records.models import KeyedTask
from .records.statuses import ACTIVE_STATUSES


def write_submission_rows() -> int:
    """Write now the rows of submissions the gate still keeps; how many were written.

    A submission's row is written by the workers within
    ``KEYED_QUEUE_RECORD_FLUSH_SECONDS``, not by ``apply_async``: a test that
    looks at rows right after submitting, without a worker, calls this first.
    """
    return submissions.write_due(get_gate())


def wait_for_keyed_tasks(*task_ids: str, timeout: float = 30.0, interval: float = 0.1) -> list[KeyedTask]:
    """Wait until the given keyed tasks (every recorded one if none is given) have ended; their records.

    For tests with a real worker: a task has ended when its latest record is
    ``succeeded``, ``failed``, ``cancelled``, ``ignored`` or ``rejected``. Raises
    ``AssertionError`` naming the tasks still active after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        write_submission_rows()
        rows = KeyedTask.objects.order_by("enqueued_at", "pk")
        if task_ids:
            rows = rows.filter(task_id__in=task_ids)
        latest = {row.task_id: row for row in rows}  # a task id Celery reused: its last submission
        missing = set(task_ids) - set(latest)
        active = [row for row in latest.values() if row.status in ACTIVE_STATUSES]
        if not missing and not active:
            return list(latest.values())
        if time.monotonic() >= deadline:
            waiting = [f"{row.task_name}[{row.task_id}] key={row.key!r} {row.status}" for row in active]
            waiting += [f"{task_id}: no record yet" for task_id in sorted(missing)]
            raise AssertionError(f"keyed tasks still not ended after {timeout}s: {'; '.join(waiting)}")
        time.sleep(interval)
