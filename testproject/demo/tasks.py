"""Tasks of the demo, and the ones the tests and benchmarks drive."""

from __future__ import annotations

import time

from celery import shared_task

from django_keyed_queue import KeyedSerialTask, keyed_serial_task

from . import history


@keyed_serial_task(key="account:{account_id}")
def sync_account(account_id: int, full: bool = False) -> str:
    time.sleep(0.5 if full else 0.1)
    return f"synced account {account_id}"


@keyed_serial_task(key=lambda path, data: path, limit=1, bind=True, max_retries=3)
def write_file(self, path: str, data: str) -> int:
    time.sleep(0.05)
    return len(data)


def logged_step(key: str, n: int, duration: float) -> int:
    """Log start and end around a sleep: the history shows order and overlap."""
    history.log("start", key, n)
    time.sleep(duration)
    history.log("end", key, n)
    return n


@keyed_serial_task(key="{key}")
def step(key: str, n: int, duration: float = 0.0) -> int:
    return logged_step(key, n, duration)


@keyed_serial_task(key="{key}", limit=2)
def step_pair(key: str, n: int, duration: float = 0.0) -> int:
    return logged_step(key, n, duration)


@keyed_serial_task(key="{key}", bind=True, max_retries=5)
def flaky_step(self, key: str, n: int, failures: int, countdown: float = 0.5) -> int:
    """Fails its first ``failures`` attempts, retrying each time after ``countdown``."""
    history.log("start", key, n, attempt=self.request.retries)
    if self.request.retries < failures:
        history.log("end", key, n, attempt=self.request.retries, outcome="retry")
        try:
            raise ConnectionError(f"the bank timed out on attempt {self.request.retries + 1}")
        except ConnectionError as exc:
            raise self.retry(exc=exc, countdown=countdown) from exc
    history.log("end", key, n, attempt=self.request.retries)
    return n


@keyed_serial_task(key="{key}", bind=True, max_recoveries=2)
def lingering_step(self, key: str, n: int, linger: float = 0.0) -> int:
    """Lingers on its first attempt only, where a crash test kills or stalls it."""
    attempt = self.request.keyed_attempts
    history.log("start", key, n, attempt=attempt)
    if attempt == 1:
        time.sleep(linger)
    history.log("end", key, n, attempt=attempt, holds=self.holds_key())
    return n


@keyed_serial_task(key="{key}", time_limit=60)
def timed_step(key: str, n: int, duration: float = 0.0) -> int:
    """A step with a time limit: the pool enforces it per message, so it never runs by local handoff."""
    return logged_step(key, n, duration)


@keyed_serial_task(key="{key}", time_limit=1)
def hard_limited_step(key: str, n: int, duration: float = 0.0) -> int:
    """A step with a hard time limit of 1 s: its worker kills a longer one."""
    return logged_step(key, n, duration)


class LingersAfterReturn(KeyedSerialTask):
    """Lingers after its result is stored, before its process runs the key's next task
    (local handoff): a crash test kills the process in that window."""

    def after_return(self, status, retval, task_id, args, kwargs, einfo):
        key, n, _, linger = args
        history.log("returned", key, n)
        time.sleep(linger)


@keyed_serial_task(key="{key}", base=LingersAfterReturn)
def returning_step(key: str, n: int, duration: float = 0.0, linger: float = 0.0) -> int:
    return logged_step(key, n, duration)


@keyed_serial_task(key="{key}", on_failure="block")
def ledger_entry(key: str, n: int) -> int:
    """A ledger's entry: it fails while a test tells its key to (``history.tell_to_fail``), and a failure
    blocks its key until an operator retries or cancels it."""
    if history.told_to_fail(key):
        raise RuntimeError(f"the ledger {key} refused entry {n}")
    return logged_step(key, n, 0.0)


@keyed_serial_task(key="{key}")
def failing_step(key: str, n: int) -> None:
    history.log("start", key, n)
    history.log("end", key, n, outcome="error")
    raise RuntimeError(f"step {n} of {key} fails on purpose")


@keyed_serial_task(key="{key}", coalesce=True)
def latest_step(key: str, n: int, duration: float = 0.0) -> int:
    """A step of a coalescing key: one runs, the latest waits, the rest are superseded."""
    return logged_step(key, n, duration)


@keyed_serial_task(key="{key}", debounce=1.5)
def debounced_step(key: str, n: int, duration: float = 0.0) -> int:
    """A step of a debounced key: of a burst, only the last runs, 1.5 s after it."""
    return logged_step(key, n, duration)


@keyed_serial_task(key="{key}", debounce=600)
def slow_debounced_step(key: str, n: int, duration: float = 0.0) -> int:
    """A step of a key debounced for 10 minutes: what an operator may want to run now."""
    return logged_step(key, n, duration)


@keyed_serial_task(key="{key}")
def keyed_noop(key: str, i: int) -> None:
    return None


@shared_task
def plain_noop(key: str, i: int) -> None:
    return None


@shared_task
def plain_step(key: str, n: int, duration: float = 0.0) -> int:
    return logged_step(key, n, duration)


@keyed_serial_task(key="order:{order_id}", idempotent=True)
def charge(order_id: int, amount: str, currency: str = "EUR") -> str:
    """Logs each run, so a test can count how many times a charge really ran."""
    history.log("start", f"order:{order_id}", 0)
    history.log("end", f"order:{order_id}", 0)
    return f"charged {amount} {currency} for order {order_id}"


def _attempt(task, key: str, n: int, seconds: float) -> int:
    """Runs ``seconds``, logging the attempt; its end says whether it still held its key."""
    attempt = task.request.keyed_attempts
    history.log("start", key, n, attempt=attempt)
    time.sleep(seconds)
    history.log("end", key, n, attempt=attempt, holds=task.holds_key())
    return n


@keyed_serial_task(key="{key}", bind=True, time_limit=6)
def time_limited_step(self, key: str, n: int, seconds: float = 0.0) -> int:
    """Every attempt under a hard time limit of 6 s."""
    return _attempt(self, key, n, seconds)


@keyed_serial_task(key="{key}", bind=True, soft_time_limit=6)
def soft_limited_step(self, key: str, n: int, seconds: float = 0.0) -> int:
    """Every attempt under a soft time limit of 6 s."""
    return _attempt(self, key, n, seconds)


# -- the demo's own scenes (see scenario.py): each leaves something in the admin to look at --


@keyed_serial_task(key="report:{name}")
def build_report(name: str, seconds: float = 60.0) -> str:
    """A slow task: while it runs, the live keys page shows its key's holder and the queue behind it."""
    time.sleep(seconds)
    return f"built the {name} report"


@keyed_serial_task(key="invoice:{invoice_id}")
def send_invoice(invoice_id: int) -> str:
    """Fails: its record keeps the error, and the next task of its key runs."""
    address = _billing_address(invoice_id)
    return f"sent invoice {invoice_id} to {address}"


def _billing_address(invoice_id: int) -> str:
    raise ValueError(f"invoice {invoice_id} has no billing address")


@keyed_serial_task(key="webhook:{hook_id}", bind=True, max_retries=3)
def deliver_webhook(self, hook_id: int, failures: int = 1) -> str:
    """Fails its first ``failures`` attempts and retries a second later; its key stays held meanwhile."""
    if self.request.retries < failures:
        raise self.retry(exc=ConnectionError(f"webhook {hook_id}: the endpoint did not answer"), countdown=1)
    return f"delivered webhook {hook_id} on attempt {self.request.retries + 1}"
