"""What the compatibility tier's tasks and signal receivers saw, in the order it happened.

Every process (the test's, each worker's main and child processes) appends to
one Redis list, so a test reads back one total order of events with no clocks
to compare. It lives in the database the tests' ``gate_redis`` fixture empties
before each test.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

from celery import current_task

from testproject.demo import history

JOURNAL = "testproject:compat:journal"


def note(event: str, **fields: object) -> None:
    entry = {"event": event, "pid": os.getpid(), "t": time.time(), **fields}
    history.client().rpush(JOURNAL, json.dumps(entry, default=repr))


def read() -> list[dict]:
    return [json.loads(raw) for raw in history.client().lrange(JOURNAL, 0, -1)]


@contextmanager
def running(key: str, **fields: object) -> Iterator[None]:
    """Note the start and the end of a task body run for ``key`` (its task id when it runs as a task)."""
    request = current_task.request if current_task else None
    task_id = getattr(request, "id", None)
    note("start", key=key, id=task_id, **fields)
    try:
        yield
    finally:
        note("end", key=key, id=task_id)
