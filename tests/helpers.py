"""Shared checks over the recorded history and the records."""

from __future__ import annotations

from collections import defaultdict

from django_keyed_queue.records.models import KeyedTask
from django_keyed_queue.records.statuses import TERMINAL_STATUSES
from testproject.demo import history
from tests.waiting import wait_until

__all__ = ["check_history", "read_history", "wait_for_records", "wait_until"]


def wait_for_records(task_ids, timeout: float = 90) -> dict[str, KeyedTask]:
    """Wait until every task's record is terminal; returns them by task id."""
    ids = list(task_ids)

    def done():
        rows = {r.task_id: r for r in KeyedTask.objects.filter(task_id__in=ids)}
        if len(rows) == len(ids) and all(r.status in TERMINAL_STATUSES for r in rows.values()):
            return rows
        return None

    return wait_until(done, timeout, 0.2, f"{len(ids)} records to finish")


def check_history(events: list[dict], limit: int = 1, accepted: dict[str, list[int]] | None = None) -> dict:
    """Assert exclusion and order over a history; returns the first starts per key.

    Exclusion: at most ``limit`` tasks of a key between start and end at once.
    Order: tickets are granted first in, first out, so when task n starts, at
    most ``limit - 1`` tasks of its key submitted before it have not started
    (they hold the other slots). With limit 1 this is strict submission order.
    Task numbers ``n`` are in the gate's accepted order per key unless
    ``accepted`` gives that order for a key.
    """
    running: dict[str, set[int]] = defaultdict(set)
    started: dict[str, list[int]] = defaultdict(list)
    for e in events:
        key, n = e["key"], e["n"]
        if e["event"] == "start":
            running[key].add(n)
            assert len(running[key]) <= limit, f"key {key}: {sorted(running[key])} ran at once"
            if n not in started[key]:
                started[key].append(n)
                order = (accepted or {}).get(key) or range(n)
                before = order[: order.index(n)] if n in order else order
                skipped = [m for m in before if m not in started[key]]
                assert len(skipped) <= limit - 1, f"key {key}: {n} started before {skipped}"
        else:
            running[key].discard(n)
    return started


def read_history() -> list[dict]:
    return history.read()
