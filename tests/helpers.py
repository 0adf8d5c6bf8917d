"""Shared checks over the recorded history and the records."""

from __future__ import annotations

import time
from collections import defaultdict

from django_keyed_queue.models import KeyedTask
from django_keyed_queue.statuses import TERMINAL_STATUSES
from testproject.demo import history


def wait_until(predicate, timeout: float = 60, interval: float = 0.1, message: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


def wait_for_records(task_ids, timeout: float = 90) -> dict[str, KeyedTask]:
    """Wait until every task's record is terminal; returns them by task id."""
    ids = list(task_ids)

    def done():
        rows = {r.task_id: r for r in KeyedTask.objects.filter(task_id__in=ids)}
        if len(rows) == len(ids) and all(r.status in TERMINAL_STATUSES for r in rows.values()):
            return rows
        return None

    return wait_until(done, timeout, 0.2, f"{len(ids)} records to finish")


def check_history(events: list[dict], limit: int = 1) -> dict[str, list[int]]:
    """Assert exclusion (at most ``limit`` running per key) and start order; returns start order per key."""
    running: dict[str, set[int]] = defaultdict(set)
    starts: dict[str, list[int]] = defaultdict(list)
    for e in events:
        key, n = e["key"], e["n"]
        if e["event"] == "start":
            running[key].add(n)
            assert len(running[key]) <= limit, f"key {key}: {sorted(running[key])} ran at once"
            starts[key].append(n)
        else:
            running[key].discard(n)
    for key, order in starts.items():
        first_starts = list(dict.fromkeys(order))
        assert first_starts == sorted(first_starts), f"key {key} started out of order: {first_starts}"
    return starts


def read_history() -> list[dict]:
    return history.read()
