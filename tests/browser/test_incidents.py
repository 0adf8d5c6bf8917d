"""The on-call engineer's incidents, each solved from the admin's home page in at most four clicks.

Each test starts at ``/admin/`` in a fresh browser, as someone who reads no code, and counts the
clicks that load a page. Pictures of each step go to the run's screenshots, and to the docs when
asked (``KEYED_QUEUE_DOCS_SCREENSHOTS=1``, see docs/operations.md).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from django_keyed_queue.gate import Finish, Start
from django_keyed_queue.ops.actions import recovery
from django_keyed_queue.process.state import get_gate
from django_keyed_queue.records.models import KeyedTask
from django_keyed_queue.testing import write_submission_rows
from testproject.demo.tasks import charge, step
from tests.browser.on_call import Operator

pytestmark = pytest.mark.django_db(transaction=True)
#: No worker reads this queue: what the operator dispatches stays put for the test to see.
QUEUE = "keyed-queue-browser-unconsumed"
#: The steps pictured in docs/operations.md.
DOCS_SHOTS = frozenset({"waiting-task", "stuck-release-confirm"})


def submit(key: str, n: int) -> KeyedTask:
    result = step.apply_async((key, n), queue=QUEUE)
    write_submission_rows()  # as a worker does within KEYED_QUEUE_RECORD_FLUSH_SECONDS
    return KeyedTask.objects.get(task_id=result.id)


def running(task: KeyedTask, *, for_seconds: float, worker: str = "celery@worker-1") -> int:
    """Start ``task`` as its worker would; returns its fencing token."""
    started = get_gate().start(Start(task.key, task.ticket, 1, max_lost=3))
    assert started.ok
    since = timezone.now() - timedelta(seconds=for_seconds)
    KeyedTask.objects.filter(pk=task.pk).update(status="running", started_at=since, worker=worker, attempts=1)
    return started.token


def test_account_6_never_syncs_its_key_is_paused(gate_redis, logged_in, screenshot):
    recovery.pause("account:6", by="olga (manage.py keyed_queue_pause)")
    waiting = [submit("account:6", n) for n in (1, 2)]
    submit("account:7", 1)
    on_call = Operator(logged_in, screenshot, DOCS_SHOTS)

    row = on_call.live_key("6", "account:6")
    on_call.shoot("paused-key-live")
    assert row.locator("td.paused").inner_text().startswith("paused by olga (manage.py keyed_queue_pause)\nsince ")
    assert row.locator("td.depth").inner_text() == "2"
    assert on_call.page.locator('#live-keys tr[data-key="account:7"]').count() == 0, "only the keys with the word 6"
    on_call.click(row.get_by_role("button", name="Resume"))
    on_call.shoot("paused-key-resumed")
    assert "Key 'account:6' resumed by operator; 1 dispatched" in on_call.text(".messagelist")
    assert on_call.page.url.endswith("?key=6"), "the page keeps its filter after the action"
    assert KeyedTask.objects.get(pk=waiting[0].pk).status == "dispatched"


def test_an_invoice_failed_retry_it_from_its_page(gate_redis, logged_in, screenshot):
    result = charge.apply_async((41, "120.00"), queue=QUEUE)
    write_submission_rows()
    failed = KeyedTask.objects.get(task_id=result.id)
    started = get_gate().start(Start(failed.key, failed.ticket, 1))
    get_gate().finish(Finish(failed.key, failed.ticket, started.token))
    error = "Traceback (most recent call last):\n  ...\nshop.payments.CardDeclined: card declined"
    KeyedTask.objects.filter(pk=failed.pk).update(status="failed", error=error, finished_at=timezone.now())
    on_call = Operator(logged_in, screenshot, DOCS_SHOTS)

    on_call.click(on_call.page.get_by_role("link", name="Keyed tasks"))
    on_call.search("#searchbar", "41")  # the order's number: its one task opens
    assert "CardDeclined: card declined" in on_call.text(".field-error")
    shown = on_call.page.locator(".field-error .readonly")
    white_space, font = shown.evaluate("e => [getComputedStyle(e).whiteSpace, getComputedStyle(e).fontFamily]")
    assert white_space == "pre-wrap" and "monospace" in font, "a traceback as written: fixed-width"
    assert "\n  ...\n" in shown.inner_text(), "its indentation kept"
    on_call.click(on_call.page.get_by_role("link", name="Retry…"))
    on_call.shoot("failed-retry-confirm")
    assert "is submitted again as a new task, with the same arguments" in on_call.text("#what-it-does")
    on_call.click(on_call.page.get_by_role("button", name="Yes, retry"))
    [again] = KeyedTask.objects.exclude(pk=failed.pk)
    assert f"Retried by operator as {again.task_id}" in on_call.text(".messagelist")
    assert on_call.text(".field-retried_as_link").endswith(again.task_id), "the failed task says it was retried"
    on_call.shoot("failed-retried")


def test_the_monthly_report_key_is_stuck_behind_a_long_run_release_it(gate_redis, logged_in, screenshot):
    holder, behind = submit("report:monthly", 1), submit("report:monthly", 2)
    token = running(holder, for_seconds=42 * 60)
    submit("account:9", 1)
    on_call = Operator(logged_in, screenshot, DOCS_SHOTS)

    on_call.click(on_call.page.get_by_role("link", name="Live keys"))
    row = on_call.page.locator('#live-keys tr[data-key="report:monthly"]')
    assert "held for 42 min" in row.locator(".holder").inner_text()
    assert row.locator("td.depth").inner_text() == "1"
    assert row.locator("td.depth a").get_attribute("href").endswith("?q=report%3Amonthly&status__exact=waiting")
    on_call.shoot("stuck-live-keys")
    on_call.click(row.get_by_role("link", name=f"Release {holder.task_id[:8]}…"))
    what = on_call.text("#what-it-does")
    on_call.shoot("stuck-release-confirm")
    assert f"fencing token {token}" in what and "The released run is not stopped" in what
    on_call.click(on_call.page.get_by_role("button", name="Yes, release"))
    assert f"[{holder.task_id}]: Released by operator (redispatch)" in on_call.text(".messagelist")
    assert on_call.page.url.endswith("/keys/"), "back on the live keys page"
    assert get_gate().inspect("report:monthly").holders[holder.ticket].dispatch == 2
    assert KeyedTask.objects.get(pk=behind.pk).status == "waiting", "the key's order holds: the released run is next"


def test_a_waiting_tasks_page_names_what_it_waits_for(gate_redis, logged_in, screenshot):
    holder, ahead, waiting = (submit("account:3", n) for n in (1, 2, 3))
    running(holder, for_seconds=95)
    on_call = Operator(logged_in, screenshot, DOCS_SHOTS)

    on_call.click(on_call.page.get_by_role("link", name="Keyed tasks"))
    on_call.click(on_call.page.get_by_role("link", name=waiting.task_id[:8], exact=True))
    why = on_call.text("#why")
    on_call.shoot("waiting-task")
    assert why.startswith("Why it waits: waiting")
    assert f"testproject.demo.tasks.step[{holder.task_id}] holds the key: running for 1 min 3" in why
    assert "on celery@worker-1" in why and "1 task of the key waits ahead of it" in why
    assert on_call.text(".field-waited .readonly").startswith("waiting for ")
    labels = on_call.page.locator("#key-timeline text").evaluate_all("texts => texts.map(t => t.textContent)")
    assert [label.split()[0] for label in labels] == ["#1", "#2", "#3"], "the timeline in ticket order"
    on_call.click(
        on_call.page.locator("#holding").get_by_role("link", name=f"testproject.demo.tasks.step[{holder.task_id}]")
    )
    assert on_call.text("#why").startswith("What it does now: running")
    assert ahead.status == "waiting"
