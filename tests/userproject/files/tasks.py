"""The user project's tasks: each run appends its start and end to a history file.

Lines appended with O_APPEND by any process land whole and in the order they were
written, so the file orders starts and ends across workers without comparing clocks.
"""

import json
import os
import time

from celery import shared_task
from django.conf import settings

from django_keyed_queue import keyed_serial_task


def log(event: str, key: str, n: int, task_id: str, **extra: object) -> None:
    entry = {"event": event, "key": key, "n": n, "id": task_id, "pid": os.getpid(), "t": time.time(), **extra}
    line = json.dumps(entry)
    fd = os.open(settings.BASE_DIR / "history.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def logged(task_id: str, key: str, n: int, seconds: float) -> int:
    log("start", key, n, task_id)
    time.sleep(seconds)
    log("end", key, n, task_id)
    return n


@keyed_serial_task(key="{key}", bind=True)
def step(self, key: str, n: int, seconds: float = 0.0) -> int:
    return logged(self.request.id, key, n, seconds)


@shared_task(bind=True)
def plain_step(self, key: str, n: int, seconds: float = 0.0) -> int:
    return logged(self.request.id, key, n, seconds)


@keyed_serial_task(key="{key}", bind=True, time_limit=9)
def time_limited_step(self, key: str, n: int, seconds: float = 0.0) -> int:
    """Runs ``seconds`` on every attempt under a hard time limit of 9 s; its end says whether it held its key."""
    attempt = self.request.keyed_attempts
    log("start", key, n, self.request.id, attempt=attempt)
    time.sleep(seconds)
    log("end", key, n, self.request.id, attempt=attempt, holds=self.holds_key())
    return n


@keyed_serial_task(key="{key}", bind=True)
def fenced_step(self, key: str, n: int, seconds: float = 0.0) -> int:
    """Logs its fencing token, the number a user stores with a write to refuse older writers."""
    log("start", key, n, self.request.id, token=self.keyed_lease.token)
    time.sleep(seconds)
    log("end", key, n, self.request.id)
    return n


@keyed_serial_task(key="{key}", bind=True)
def replaced_step(self, key: str, n: int) -> int:
    """Replaces itself with ``step`` of the same key (number ``n + 100``), which joins the key's queue."""
    raise self.replace(step.si(key, n + 100))


@keyed_serial_task(key="{key}", bind=True, acks_late=True)
def rejected_step(self, key: str, n: int) -> int:
    """Rejects its first delivery with ``Reject(requeue=True)``; the delivery after it runs."""
    from celery.exceptions import Reject

    marker = settings.BASE_DIR / f"rejected-{self.request.id}"
    if not marker.exists():
        marker.touch()
        raise Reject("the first delivery is rejected", requeue=True)
    return logged(self.request.id, key, n, 0.0)


@keyed_serial_task(key="{key}", bind=True)
def total(self, values: list[int], key: str) -> int:
    """A chord's body: the sum of its header's results (logged as number ``1000 + sum``)."""
    return logged(self.request.id, key, 1000 + sum(values), 0.0) - 1000


@keyed_serial_task(key="{key}", bind=True, max_retries=1)
def retried_step(self, key: str, n: int) -> int:
    """Retries its first attempt after 0.2 s, keeping its key; the retry runs."""
    if self.request.retries == 0:
        raise self.retry(countdown=0.2)
    return logged(self.request.id, key, n, 0.0)
