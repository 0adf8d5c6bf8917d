"""The user project's tasks: each run appends its start and end to a history file.

Lines appended with O_APPEND by any process land whole and in the order they were
written, so the file orders starts and ends across workers without comparing clocks.
"""

import json
import os
import signal
import time

from celery import shared_task
from celery.signals import before_task_publish
from django.conf import settings

from django_keyed_queue import keyed_serial_task, pooled_task


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


@keyed_serial_task(key="{key}", bind=True, pool="three")
def pooled_step(self, key: str, n: int, seconds: float = 0.0) -> int:
    """A step of pool "three": at most three run at once, whatever their keys."""
    return logged(self.request.id, key, n, seconds)


@pooled_task(pool="three", bind=True)
def plain_pooled_step(self, key: str, n: int, seconds: float = 0.0) -> int:
    """A task of no key in pool "three": it shares the pool's three slots with the keyed ones."""
    return logged(self.request.id, key, n, seconds)


@keyed_serial_task(key="{key}", bind=True, pool="five_a_second")
def rated_pool_step(self, key: str, n: int, seconds: float = 0.0) -> int:
    """A step of pool "five_a_second": at most five start a second, whatever their keys. Its start's line
    also says the pool's last start as the gate's clock has it (its own, unless the line comes 200 ms late)."""
    from django_keyed_queue.gate.keys import PoolNames
    from django_keyed_queue.process.state import get_gate

    last_start = get_gate().client.hget(PoolNames("five_a_second").meta, "last_start")
    log("start", key, n, self.request.id, gate_start_ms=int(last_start or 0))
    time.sleep(seconds)
    log("end", key, n, self.request.id)
    return n


@shared_task(bind=True)
def plain_step(self, key: str, n: int, seconds: float = 0.0) -> int:
    return logged(self.request.id, key, n, seconds)


# The benchmark's (bench/userproject.py): its realistic workload, and plain tasks that store their result
# (the project's CELERY_RESULT_BACKEND, which the benchmark sets to django-celery-results').


def synced(task_id: str, key: str, n: int, account_id: int) -> int:
    """A task as users write them: one of their rows read and updated, then 10 ms waiting, as on an HTTP call."""
    from django.utils import timezone

    from .models import Account

    log("start", key, n, task_id)
    account = Account.objects.get(pk=account_id)
    account.syncs += 1
    account.synced_at = timezone.now()
    account.save(update_fields=["syncs", "synced_at"])
    time.sleep(0.01)
    log("end", key, n, task_id)
    return n


@keyed_serial_task(key="{key}", bind=True)
def sync_step(self, key: str, n: int, account_id: int) -> int:
    return synced(self.request.id, key, n, account_id)


@shared_task(bind=True)
def plain_sync_step(self, key: str, n: int, account_id: int) -> int:
    return synced(self.request.id, key, n, account_id)


@keyed_serial_task(key="{key}", bind=True, pool="roomy")
def roomy_step(self, key: str, n: int, seconds: float = 0.0) -> int:
    """``step`` in pool "roomy", which it never fills: its runs pay the pool's calls and never wait for it."""
    return logged(self.request.id, key, n, seconds)


@shared_task(bind=True, ignore_result=False)
def plain_step_stored(self, key: str, n: int, seconds: float = 0.0) -> int:
    """``plain_step`` storing its result even where the project ignores results by default."""
    return logged(self.request.id, key, n, seconds)


@shared_task(bind=True, ignore_result=False)
def plain_sync_step_stored(self, key: str, n: int, account_id: int) -> int:
    """``plain_sync_step`` storing its result even where the project ignores results by default."""
    return synced(self.request.id, key, n, account_id)


@keyed_serial_task(key="{key}", bind=True, coalesce=True)
def latest_step(self, key: str, n: int, seconds: float = 0.0) -> int:
    """A step of a coalescing key: one runs, the latest waits, the rest are superseded."""
    return logged(self.request.id, key, n, seconds)


@keyed_serial_task(key="{key}", bind=True, debounce=1.5)
def debounced_step(self, key: str, n: int, seconds: float = 0.0) -> int:
    """A step of a debounced key: of a burst, only the last runs, 1.5 s after it."""
    return logged(self.request.id, key, n, seconds)


@keyed_serial_task(key="{key}", bind=True, coalesce=True)
def stoppable_step(self, key: str, n: int, seconds: float = 0.0) -> int:
    """A long step of a coalescing key that stops early, polling every 50 ms, once a newer one waits."""
    log("start", key, n, self.request.id)
    deadline = time.time() + seconds
    while time.time() < deadline:
        if self.superseded():
            log("end", key, n, self.request.id, superseded=True)
            return n
        time.sleep(0.05)
    log("end", key, n, self.request.id)
    return n


@keyed_serial_task(key="{key}", bind=True, debounce=600)
def slow_debounced_step(self, key: str, n: int, seconds: float = 0.0) -> int:
    """Debounced for 10 minutes: what an operator may want to run now."""
    return logged(self.request.id, key, n, seconds)


@keyed_serial_task(key="{key}", bind=True, rate="2/h")
def hourly_step(self, key: str, n: int, seconds: float = 0.0) -> int:
    """Two an hour per key: the second of a key waits half an hour, unless an operator runs it now."""
    return logged(self.request.id, key, n, seconds)


@keyed_serial_task(key="{key}", bind=True, rate="5/s")
def paced_step(self, key: str, n: int, seconds: float = 0.0) -> int:
    """A step of an interval queue: one key's starts at least 200 ms apart. Its start's line also says the
    key's last start as the gate's clock has it (its own, unless the line comes over 200 ms late)."""
    from django_keyed_queue.gate.keys import KeyNames
    from django_keyed_queue.process.state import get_gate

    last_start = get_gate().client.hget(KeyNames(key).meta, "last_start")
    log("start", key, n, self.request.id, gate_start_ms=int(last_start or 0))
    time.sleep(seconds)
    log("end", key, n, self.request.id)
    return n


def failing_while_told(task_id: str, key: str, n: int, seconds: float) -> int:
    """A step that fails while the file ``fail-<key>-<n>`` is in the project."""
    log("start", key, n, task_id)
    if (settings.BASE_DIR / f"fail-{key}-{n}").exists():
        log("end", key, n, task_id, failed=True)
        raise RuntimeError(f"step {n} of {key} failed")
    time.sleep(seconds)
    log("end", key, n, task_id)
    return n


@keyed_serial_task(key="{key}", bind=True, on_failure="block")
def strict_step(self, key: str, n: int, seconds: float = 0.0) -> int:
    """A ledger's step: it fails while the file ``fail-<key>-<n>`` is in the project, and then its key
    runs nothing more until an operator retries or cancels it."""
    return failing_while_told(self.request.id, key, n, seconds)


@keyed_serial_task(key="{key}", bind=True)
def stubborn_step(self, key: str, n: int, seconds: float = 0.0) -> int:
    """A run that ignores SIGTERM (as code stuck in a C call, or with its own handler, may): only SIGKILL ends it."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        return logged(self.request.id, key, n, seconds)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@keyed_serial_task(key="{key}", bind=True)
def fallible_step(self, key: str, n: int, seconds: float = 0.0) -> int:
    """A step that fails while the file ``fail-<key>-<n>`` is in the project; its key moves on."""
    return failing_while_told(self.request.id, key, n, seconds)


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


# Twins: one body, as a keyed task and as a plain one, for the side-by-side checks.


def request_fields(self, key: str, n: int, names: list, seconds: float = 0.0) -> dict:
    """What ``self.request`` holds under ``names``, after a logged run of ``seconds``."""
    logged(self.request.id, key, n, seconds)
    return {name: self.request.get(name) for name in names}


keyed_fields = keyed_serial_task(key="{key}", bind=True, name="shop.tasks.keyed_fields")(request_fields)
plain_fields = shared_task(bind=True, name="shop.tasks.plain_fields")(request_fields)


def add_untyped(key: str, x: int, y: int) -> int:
    return x + y


keyed_untyped = keyed_serial_task(key="{key}", typing=False, name="shop.tasks.keyed_untyped")(add_untyped)
plain_untyped = shared_task(typing=False, name="shop.tasks.plain_untyped")(add_untyped)

try:
    from pydantic import BaseModel
except ImportError:  # pydantic=True tasks need it
    pass
else:

    class Person(BaseModel):
        name: str

    class Greeting(BaseModel):
        text: str

    def greet(person: Person, key: str) -> Greeting:
        return Greeting(text=f"hello {person.name}")

    keyed_greet = keyed_serial_task(key="{key}", pydantic=True, name="shop.tasks.keyed_greet")(greet)
    plain_greet = shared_task(pydantic=True, name="shop.tasks.plain_greet")(greet)


@before_task_publish.connect
def _note_publisher(headers=None, **_: object) -> None:
    """As tracing tools do: a header of the publisher's own; each publish is noted in published.jsonl."""
    if headers is None:
        return
    headers["published_by"] = os.getpid()
    line = json.dumps({"id": headers.get("id"), "pid": os.getpid()}) + "\n"
    fd = os.open(settings.BASE_DIR / "published.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


@keyed_serial_task(key=lambda account_id, n: f"account:{int(account_id)}")
def by_callable(account_id: int, n: int) -> int:
    """A key callable that raises for a bad account id: the submission fails with InvalidKey."""
    return n


@keyed_serial_task(key="{key}", bind=True)
def order_seen(self, key: str, n: int, order_id: int) -> int:
    """Logs whether the order its transaction wrote is there when it runs."""
    from .models import Order

    log("start", key, n, self.request.id, seen=Order.objects.filter(pk=order_id).exists())
    log("end", key, n, self.request.id)
    return n


@keyed_serial_task(key="{pair}", bind=True)
def pair_step(self, pair: tuple, n: int) -> int:
    """A key made from a tuple: the producer formats ``(1, 2)``, the worker gets the list ``[1, 2]``."""
    return logged(self.request.id, str(pair), n, 0.0)


@keyed_serial_task(key="{key}", bind=True)
def retried_elsewhere(self, key: str, n: int) -> int:
    """Retries with arguments of another key: a mistake, which fails the task where it is made."""
    log("start", key, n, self.request.id)
    raise self.retry(args=(f"{key}-other", n), countdown=0)


@keyed_serial_task(key="{key}", bind=True)
def handoff_step(self, key: str, n: int, seconds: float = 0.0) -> int:
    """A step that notes whether its worker runs it by local handoff (in the job of its key's previous task)."""
    from django_keyed_queue.worker.handoff import local

    log("start", key, n, self.request.id, handed_off=local().tracing is not None)
    time.sleep(seconds)
    log("end", key, n, self.request.id)
    return n
