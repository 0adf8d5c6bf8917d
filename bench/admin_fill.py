"""A million keyed task records, fast: generated in Python with a fixed seed, loaded in bulk.

SQLite takes one ``executemany`` per chunk in one transaction; PostgreSQL takes ``COPY``.
Ids increase with ``enqueued_at``, as they do when tasks are submitted.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

#: (task name, weight): names the testproject registers, so the task-name filter lists them.
TASKS = (
    ("testproject.demo.tasks.sync_account", 40),
    ("testproject.demo.tasks.write_file", 25),
    ("testproject.demo.tasks.charge", 15),
    ("testproject.demo.tasks.step", 10),
    ("testproject.demo.tasks.step_pair", 7),
    ("testproject.demo.tasks.keyed_noop", 3),
)
HOT_KEYS = 10  # "tenant:0".."tenant:9" hold a tenth of all rows (~10,000 each at a million)
COLD_KEYS = 50_000  # "account:N", ~18 rows each at a million
ACTIVE_TAIL = 300  # the newest rows are still waiting, dispatched, running or retrying
COLUMNS = (
    "task_id",
    "task_name",
    "key",
    "ticket",
    "status",
    "arguments",
    "message",
    "attempts",
    "worker",
    "enqueued_at",
    "dispatched_at",
    "started_at",
    "heartbeat_at",
    "finished_at",
    "error",
)
TABLE = "keyed_queue_keyedtask"


def generate(count: int, seed: int = 5) -> Iterator[tuple]:
    """``count`` rows, oldest first, as tuples in ``COLUMNS`` order (datetimes as UTC strings)."""
    rnd = random.Random(seed)
    names = [name for name, _ in TASKS]
    weights = [weight for _, weight in TASKS]
    tickets: Counter[str] = Counter()
    start = datetime(2025, 1, 1, tzinfo=UTC)
    step = timedelta(days=60) / max(count, 1)
    for i in range(count):
        key = f"tenant:{rnd.randrange(HOT_KEYS)}" if rnd.random() < 0.1 else f"account:{rnd.randrange(COLD_KEYS)}"
        tickets[key] += 1
        name = rnd.choices(names, weights)[0]
        task_id = str(uuid.UUID(int=rnd.getrandbits(128), version=4))
        if i >= count - ACTIVE_TAIL:
            status = rnd.choice(("waiting", "waiting", "dispatched", "running", "retrying"))
        else:
            r = rnd.random()
            status = "failed" if r < 0.02 else "cancelled" if r < 0.03 else "succeeded"
        enqueued = start + step * i
        ran = status not in ("waiting", "cancelled")
        finished = status in ("succeeded", "failed", "cancelled")
        started = enqueued + timedelta(milliseconds=rnd.randrange(5, 500)) if ran else None
        arguments = json.dumps([i % 100_000, {"full": i % 7 == 0}])
        message = json.dumps({"id": task_id, "task": name, "args": arguments, "headers": {"eta": None}, "x": "x" * 80})
        yield (
            task_id,
            name,
            key,
            tickets[key],
            status,
            arguments,
            message,
            1 if ran else 0,
            f"celery@host-{i % 4}" if ran else "",
            _ts(enqueued),
            _ts(enqueued + timedelta(milliseconds=2)) if ran else None,
            _ts(started),
            _ts(started + timedelta(milliseconds=300)) if started and finished else None,
            _ts(started + timedelta(milliseconds=rnd.randrange(10, 3000))) if started and finished else None,
            "ValueError: the upstream answered 502" if status == "failed" else "",
        )


def _ts(moment: datetime | None) -> str | None:
    return None if moment is None else moment.strftime("%Y-%m-%d %H:%M:%S.%f")


def other_columns() -> dict[str, object]:
    """Each NOT NULL column ``generate`` does not fill, with its model default: Django gives a column no
    database default, so a bulk load that left one out would fail (``retried_as``, and those added since)."""
    from django_keyed_queue.records.models import KeyedTask

    fields = KeyedTask._meta.concrete_fields
    return {f.column: f.get_default() for f in fields if not (f.primary_key or f.null or f.column in COLUMNS)}


def fill(count: int, chunk: int = 50_000) -> dict:
    """Load ``count`` rows into the default database; returns what it took."""
    from django.db import connection, transaction

    began = time.perf_counter()
    defaults = other_columns()
    columns, extra = ", ".join([*COLUMNS, *defaults]), tuple(defaults.values())
    rows = (row + extra for row in generate(count))
    with transaction.atomic(), connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            with cursor.cursor.copy(f"COPY {TABLE} ({columns}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
        else:
            sql = f"INSERT INTO {TABLE} ({columns}) VALUES ({', '.join(['%s'] * (len(COLUMNS) + len(extra)))})"
            batch = []
            for row in rows:
                batch.append(row)
                if len(batch) == chunk:
                    cursor.executemany(sql, batch)
                    batch.clear()
            if batch:
                cursor.executemany(sql, batch)
    loaded = time.perf_counter()
    with connection.cursor() as cursor:  # fresh statistics, and PostgreSQL's visibility map
        cursor.execute(f"VACUUM ANALYZE {TABLE}" if connection.vendor == "postgresql" else "ANALYZE")
    return {"rows": count, "load_seconds": loaded - began, "analyze_seconds": time.perf_counter() - loaded}
