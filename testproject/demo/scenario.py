"""What the demo submits, and what it leaves for an operator to look at.

Besides twenty quick tasks over six keys, each scene leaves one thing on the
admin's pages: a paused key with tasks waiting, a slow key running with a
queue behind it, a failed task, a task that retried and then succeeded, and
an idempotent submission made twice. A re-run tops the paused and the slow
keys up to the same picture instead of piling more tasks on them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from django.urls import reverse

from django_keyed_queue.ops.actions.recovery import pause
from django_keyed_queue.process.state import get_gate
from django_keyed_queue.records.models import KeyedTask
from django_keyed_queue.records.statuses import Status

PAUSED_KEY = "account:6"
SLOW_KEY = "report:monthly"
PAUSED_WAITING = 3  # tasks kept waiting behind the paused key
SLOW_TASKS = 4  # a slow task running and three behind it: about four minutes of queue
SLOW_SECONDS = 60.0


@dataclass
class Submitted:
    quick: list[str] = field(default_factory=list)  # sync_account and write_file: done in seconds
    failed: str = ""  # send_invoice
    retried: str = ""  # deliver_webhook
    charges: tuple[str, str] = ("", "")  # the same charge, submitted twice
    topped_up: dict[str, int] = field(default_factory=dict)  # key -> tasks submitted to it now

    @property
    def ids(self) -> list[str]:
        return [*self.quick, self.failed, self.retried, self.charges[0]]


def submit() -> Submitted:
    from .tasks import build_report, charge, deliver_webhook, send_invoice, sync_account, write_file

    done = Submitted()
    # A new invoice and a new webhook each run: a key that a stopped run left held (a task cut while
    # granted waits for the reaper, up to the dispatch timeout) must not hold this run's scenes back.
    runs = KeyedTask.objects.filter(task_name=send_invoice.name).count()
    # The slow key first, so that it takes a worker process before the quick tasks fill them.
    done.topped_up[SLOW_KEY] = _top_up(SLOW_KEY, SLOW_TASKS, lambda: build_report.delay("monthly", SLOW_SECONDS))
    pause(PAUSED_KEY, by="the demo")  # before its tasks, so that none of them starts
    done.topped_up[PAUSED_KEY] = _top_up(PAUSED_KEY, PAUSED_WAITING, lambda: sync_account.delay(6))
    done.failed = send_invoice.delay(42 + runs).id
    done.retried = deliver_webhook.delay(7 + runs).id
    done.charges = (charge.delay(1001, "49.90").id, charge.delay(1001, "49.90").id)
    for round_ in range(3):
        for account_id in range(1, 6):
            done.quick.append(sync_account.delay(account_id, full=round_ == 0).id)
    for i in range(5):
        done.quick.append(write_file.delay("reports/daily.csv", f"line {i}\n").id)
    return done


def _top_up(key: str, wanted: int, submit_one) -> int:
    """Submit to ``key`` until it has ``wanted`` unfinished tasks (those of an earlier run count)."""
    missing = max(wanted - KeyedTask.objects.for_key(key).active().count(), 0)
    for _ in range(missing):
        submit_one()
    return missing


def unsettled(done: Submitted, *, all_quick: bool = False) -> list[str]:
    """What the admin does not show yet; empty once every scene is in place."""
    statuses = dict(KeyedTask.objects.filter(task_id__in=done.ids).values_list("task_id", "status"))
    attempts = dict(KeyedTask.objects.filter(task_id=done.retried).values_list("task_id", "attempts"))
    slow, paused = get_gate().inspect_many([SLOW_KEY, PAUSED_KEY], waiting_shown=0)
    missing = []
    if statuses.get(done.failed) != Status.FAILED:
        missing.append(f"the failed task ({statuses.get(done.failed)})")
    if statuses.get(done.retried) != Status.SUCCEEDED or attempts.get(done.retried, 0) < 2:
        missing.append(f"the retried task ({statuses.get(done.retried)}, {attempts.get(done.retried)} attempts)")
    if not slow.holders or not slow.depth:
        missing.append(f"{SLOW_KEY} running with tasks waiting")
    if not paused.paused or not paused.depth:
        missing.append(f"{PAUSED_KEY} paused with tasks waiting")
    if done.charges[0] != done.charges[1]:
        missing.append("one task for the charge submitted twice")
    if all_quick:
        unfinished = sum(statuses.get(task_id) != Status.SUCCEEDED for task_id in done.quick)
        if unfinished:
            missing.append(f"{unfinished} of the {len(done.quick)} quick tasks")
    return missing


def wait_until_settled(done: Submitted, *, timeout: float, all_quick: bool = False) -> list[str]:
    """Wait for every scene to be in place; what is still missing after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while (missing := unsettled(done, all_quick=all_quick)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return missing


def describe(done: Submitted) -> list[str]:
    """The scenes, one line each, as the demo prints them."""
    slow, paused = get_gate().inspect_many([SLOW_KEY, PAUSED_KEY], waiting_shown=0)
    failed = KeyedTask.objects.get(task_id=done.failed)
    retried = KeyedTask.objects.get(task_id=done.retried)
    return [
        f"{PAUSED_KEY:<16} paused, {paused.depth} tasks waiting",
        f"{SLOW_KEY:<16} build_report ({SLOW_SECONDS:.0f} s a report) holds it, {slow.depth} more waiting behind it",
        f"{failed.key:<16} send_invoice failed: {failed.error.splitlines()[0]} (its traceback is on its page)",
        f"{retried.key:<16} deliver_webhook failed once, retried and succeeded ({retried.attempts} attempts)",
        f"{'order:1001':<16} charge submitted twice, one task: {done.charges[0]} (both calls returned it)",
    ]


def admin_paths(done: Submitted) -> list[tuple[str, str]]:
    """(label, path) of the admin pages worth opening first."""
    from django_keyed_queue import health

    failed = KeyedTask.objects.get(task_id=done.failed)
    return [
        ("tasks", reverse("admin:keyed_queue_keyedtask_changelist")),
        ("live keys", reverse("admin:keyed_queue_keys")),
        ("failed task", reverse("admin:keyed_queue_keyedtask_change", args=[failed.pk])),
        ("idempotency keys", reverse("admin:keyed_queue_idempotencykey_changelist")),
        ("health", reverse(health)),
    ]
