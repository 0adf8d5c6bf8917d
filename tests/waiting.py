"""Waiting on a state in the tests: poll until it holds, never sleep a fixed time."""

import time


def wait_until(predicate, timeout: float = 60, interval: float = 0.05, message: str = "condition"):
    """Poll ``predicate`` until it returns something truthy, and return that."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


def wait_for_records(task_ids, timeout: float = 90) -> dict:
    """Wait until every task's record is terminal; returns them by task id."""
    from django_keyed_queue.records.models import KeyedTask  # here: the gate tier's processes have no Django
    from django_keyed_queue.records.statuses import TERMINAL_STATUSES

    ids = list(task_ids)

    def done():
        rows = {r.task_id: r for r in KeyedTask.objects.filter(task_id__in=ids)}
        if len(rows) == len(ids) and all(r.status in TERMINAL_STATUSES for r in rows.values()):
            return rows
        return None

    return wait_until(done, timeout, 0.2, f"{len(ids)} records to finish")
