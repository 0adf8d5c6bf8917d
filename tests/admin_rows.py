"""Keyed task records for the admin's tests: a fixed mix of keys, task names and statuses."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta

from django.utils import timezone

from django_keyed_queue.records import key_words
from django_keyed_queue.records.models import KeyedTask
from django_keyed_queue.records.statuses import Status

TASK_NAMES = (
    "testproject.demo.tasks.sync_account",
    "testproject.demo.tasks.write_file",
    "testproject.demo.tasks.step",
)


#: One seek of the task-name filter's skip scan (``recorded_task_names``), as either database writes it.
TASK_NAME_SEEK = re.compile(
    r'SELECT "keyed_queue_keyedtask"\."task_name"( AS "task_name")? FROM "keyed_queue_keyedtask"'
    r'( WHERE "keyed_queue_keyedtask"\."task_name" > .+)? ORDER BY .+ LIMIT 1'
)


def is_task_name_seek(sql: str) -> bool:
    return TASK_NAME_SEEK.fullmatch(sql) is not None


def status_of(i: int) -> str:
    if i % 10 == 3:
        return Status.FAILED
    if i % 10 == 7:
        return Status.WAITING
    return Status.SUCCEEDED


def seed_tasks(count: int, keys: int = 7) -> list[KeyedTask]:
    """``count`` records, oldest first: key ``account:{i % keys}``, task name ``TASK_NAMES[i % 3]``."""
    start = timezone.now() - timedelta(seconds=count)
    rows = [
        KeyedTask(
            task_id=str(uuid.uuid4()),
            task_name=TASK_NAMES[i % len(TASK_NAMES)],
            key=f"account:{i % keys}",
            ticket=i // keys + 1,
            status=status_of(i),
            enqueued_at=start + timedelta(seconds=i),
        )
        for i in range(count)
    ]
    KeyedTask.objects.bulk_create(rows)
    write_key_words(row.key for row in rows)
    return list(KeyedTask.objects.order_by("id"))


def write_key_words(keys) -> None:
    """The keys' later words, as the records' writer writes them with a key's first row (bulk_create does not)."""
    key_words.KNOWN.clear()  # keys this process wrote in an earlier test, whose rows are gone
    key_words.remember(KeyedTask.objects.db, keys)
