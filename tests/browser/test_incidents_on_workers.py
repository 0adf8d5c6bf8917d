"""Incidents fixed from the admin's home page in at most four clicks, on real prefork workers, each
found from the number on a customer's ticket: a hung sync stopped (its key's next task runs only after
it), a debounced invoice and a ledger task waiting for its key's rate run now, once, a ledger blocked
by a failed entry retried, and a task whose worker died released to run on another.

The worker consumes a queue of its own and reaps the browser tier's gate (the server's) only while
these tests run.
"""

from __future__ import annotations

import pytest

from django_keyed_queue import set_limits
from django_keyed_queue.process.state import get_gate
from django_keyed_queue.records.models import KeyedTask
from django_keyed_queue.testing import write_submission_rows
from testproject.demo import history
from testproject.demo.tasks import ledger_entry, lingering_step, slow_debounced_step, step
from testproject.servers import Worker
from tests.browser.on_call import Operator
from tests.browser.server import DATA_DIR, GATE_URL
from tests.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.workers]
QUEUE = "keyed-queue-browser-workers"
#: The steps pictured in docs/operations.md.
DOCS_SHOTS = frozenset({"hung-stop-confirm", "ledger-live-keys-run-now"})


@pytest.fixture(scope="module")
def worker(admin_server):
    """One real prefork worker on the server's gate, consuming this module's queue."""
    started = Worker("browser", DATA_DIR / "logs", queues=QUEUE, extra_env={"TESTPROJECT_GATE_REDIS_URL": GATE_URL})
    started.start()
    yield started
    started.kill()


def status_of(task_id: str, *statuses: str) -> KeyedTask | None:
    write_submission_rows()
    return KeyedTask.objects.filter(task_id=task_id, status__in=statuses).first()


def test_a_hung_account_sync_is_stopped_and_the_next_runs_after_it(worker, gate_redis, logged_in, screenshot):
    hung = step.apply_async(("account:7734", 1, 600), queue=QUEUE)
    after = step.apply_async(("account:7734", 2), queue=QUEUE)
    running = wait_until(lambda: status_of(hung.id, "running"), timeout=30, message="the sync to start")
    on_call = Operator(logged_in, screenshot, DOCS_SHOTS)

    row = on_call.live_key("7734", "account:7734")
    assert "running" in row.locator(".holder").inner_text()
    on_call.click(row.get_by_role("link", name=f"Stop {hung.id[:8]}…"))
    on_call.shoot("hung-stop-confirm")
    assert "never beside it" in on_call.text("#what-it-does")
    on_call.click(on_call.page.get_by_role("button", name="Yes, stop"))
    assert f"SIGTERM sent to worker {running.worker}" in on_call.text(".messagelist")

    stopped = wait_until(lambda: status_of(hung.id, "failed"), timeout=30, message="the stopped run's end")
    assert stopped.error.startswith("stopped by operator (SIGTERM); its process ") and stopped.attempts == 1
    done = wait_until(lambda: status_of(after.id, "succeeded"), timeout=30, message="the next task")
    assert done.started_at >= stopped.finished_at, "the next task started after the stopped run had ended"


def test_a_debounced_invoice_found_by_its_number_runs_now(worker, gate_redis, logged_in, screenshot):
    invoice = slow_debounced_step.apply_async(("invoice:88", 1), queue=QUEUE)
    wait_until(lambda: status_of(invoice.id, "dispatched"), timeout=30, message="the invoice's grant")
    on_call = Operator(logged_in, screenshot, DOCS_SHOTS)

    on_call.click(on_call.page.get_by_role("link", name="Keyed tasks"))
    on_call.search("#searchbar", "88")  # one task found: its page opens
    assert "it is debounced" in on_call.text("#why")
    on_call.click(on_call.page.get_by_role("link", name="Run now…"))
    assert "starts now instead of waiting for its debounce" in on_call.text("#what-it-does")
    on_call.click(on_call.page.get_by_role("button", name="Yes, run now"))
    assert "Run now by operator" in on_call.text(".messagelist")

    wait_until(lambda: status_of(invoice.id, "succeeded"), timeout=30, message="the invoice to run now")


def test_a_ledger_task_waiting_for_its_keys_rate_runs_now(worker, gate_redis, logged_in, screenshot):
    set_limits(key="ledger:1001", rate="2/h")
    first = step.apply_async(("ledger:1001", 1), queue=QUEUE)
    second = step.apply_async(("ledger:1001", 2), queue=QUEUE)
    wait_until(lambda: status_of(first.id, "succeeded"), timeout=30, message="the first to run")
    wait_until(lambda: get_gate().inspect("ledger:1001").holders, timeout=30, message="the second's grant")
    on_call = Operator(logged_in, screenshot, DOCS_SHOTS)

    row = on_call.live_key("1001", "ledger:1001")
    on_call.shoot("ledger-live-keys-run-now")
    on_call.click(row.get_by_role("link", name=f"Run now {second.id[:8]}…"))
    assert "instead of waiting for its key's rate" in on_call.text("#what-it-does")
    on_call.click(on_call.page.get_by_role("button", name="Yes, run now"))

    wait_until(lambda: status_of(second.id, "succeeded"), timeout=30, message="the second to run now")


def test_a_ledger_blocked_by_a_failed_entry_is_retried_from_its_number(worker, gate_redis, logged_in, screenshot):
    history.tell_to_fail("ledger:5120")
    failed = ledger_entry.apply_async(("ledger:5120", 1), queue=QUEUE)
    behind = ledger_entry.apply_async(("ledger:5120", 2), queue=QUEUE)
    wait_until(lambda: get_gate().inspect("ledger:5120").blocked, timeout=30, message="the key blocked")
    history.tell_to_fail("ledger:5120", False)  # the ledger's cause was fixed: the entry can go through now
    on_call = Operator(logged_in, screenshot, DOCS_SHOTS)

    row = on_call.live_key("5120", "ledger:5120")
    assert f"blocked by failed task {failed.id[:8]}" in row.inner_text()
    on_call.click(row.get_by_role("link", name="Retry…"))
    assert "runs again first, as itself" in on_call.text("#what-it-does")
    on_call.click(on_call.page.get_by_role("button", name="Yes, retry"))

    for task in (failed, behind):
        wait_until(lambda task=task: status_of(task.id, "succeeded"), timeout=30, message="the ledger to move on")
    assert [e["n"] for e in history.read() if e["key"] == "ledger:5120" and e["event"] == "end"] == [1, 2]


def test_a_task_whose_worker_died_is_released_and_runs_on_another(worker, gate_redis, logged_in, screenshot):
    other_queue = f"{QUEUE}-doomed"
    doomed = Worker("doomed", DATA_DIR / "logs", queues=other_queue, extra_env={"TESTPROJECT_GATE_REDIS_URL": GATE_URL})
    replacement = Worker("replacement", DATA_DIR / "logs", queues=other_queue,
                         extra_env={"TESTPROJECT_GATE_REDIS_URL": GATE_URL})  # fmt: skip
    try:
        doomed.start()
        order = lingering_step.apply_async(("order:4471", 1, 600), queue=other_queue)  # hangs on its first attempt
        wait_until(lambda: status_of(order.id, "running"), timeout=30, message="the order's run")
        doomed.kill()  # the whole worker, SIGKILL: its lease runs on, and nothing says the run ended
        replacement.start()
        on_call = Operator(logged_in, screenshot, DOCS_SHOTS)

        row = on_call.live_key("4471", "order:4471")
        assert "running on doomed@" in row.locator(".holder").inner_text()
        on_call.click(row.get_by_role("link", name=f"Release {order.id[:8]}…"))
        on_call.click(on_call.page.get_by_role("button", name="Yes, release"))
        assert "Released by operator (redispatch)" in on_call.text(".messagelist")

        ran = wait_until(lambda: status_of(order.id, "succeeded"), timeout=30, message="the order on another worker")
        assert ran.attempts == 2 and ran.worker.startswith("replacement@")
    finally:
        doomed.kill()
        replacement.kill()
