"""An operator repairs keys in a real browser: the live keys page, its buttons, the task actions."""

from __future__ import annotations

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User

from django_keyed_queue.gate import Finish, Start
from django_keyed_queue.process.state import get_gate
from django_keyed_queue.records.models import KeyedTask
from django_keyed_queue.testing import write_submission_rows
from testproject.demo.tasks import step

pytestmark = pytest.mark.django_db(transaction=True)
LIST = "/admin/keyed_queue/keyedtask/"
KEYS = f"{LIST}keys/"
#: No worker reads this queue: what the operator dispatches stays put for the test to see.
QUEUE = "keyed-queue-browser-unconsumed"


def submit(key: str, n: int) -> KeyedTask:
    result = step.apply_async((key, n), queue=QUEUE)
    write_submission_rows()  # as a worker does within KEYED_QUEUE_RECORD_FLUSH_SECONDS
    return KeyedTask.objects.get(task_id=result.id)


def live_rows(page) -> list[str]:
    return page.locator("#live-keys tr.live-key").evaluate_all("rows => rows.map(r => r.dataset.key)")


def cell(page, key: str, name: str) -> str:
    return page.locator(f'#live-keys tr[data-key="{key}"] td.{name}').inner_text().strip()


def press(page, key: str, button: str) -> None:
    with page.expect_navigation():
        page.locator(f'#live-keys tr[data-key="{key}"]').get_by_role("button", name=button).click()


def run_action(page, description: str, *tasks: KeyedTask) -> None:
    for task in tasks:
        page.locator(f'#result_list input[name="_selected_action"][value="{task.pk}"]').check()
    page.select_option('select[name="action"]', label=description)
    with page.expect_navigation():
        page.click('button[name="index"]')
    # What it will do to each selected task is shown first, then confirmed.
    assert page.locator("#each-task tbody tr").count() == len(tasks)
    with page.expect_navigation():
        page.click("#confirm")


def test_unblocking_keys_from_the_live_page(gate_redis, logged_in, screenshot):
    page = logged_in
    busy = [submit("account:1", n) for n in (1, 2, 3)]
    assert (
        get_gate().start(Start("account:1", busy[0].ticket, 1, max_lost=3)).ok
    )  # running, its lease renewed by nobody
    get_gate().pause("account:2")
    parked = submit("account:2", 1)
    submit("account:3", 1)

    page.goto(LIST)
    with page.expect_navigation():
        page.locator(".object-tools").get_by_role("link", name="Live keys").click()
    screenshot("1-live-keys")
    assert live_rows(page) == ["account:2", "account:1", "account:3"], "the paused key with a task waiting is stuck"
    assert page.locator('tr[data-key="account:2"] .errornote').inner_text() == "stuck"
    assert cell(page, "account:1", "depth") == "2" and cell(page, "account:2", "paused").startswith("paused\nsince ")
    assert f"[{busy[0].task_id}]" in page.locator('tr[data-key="account:1"] .holder').inner_text()

    press(page, "account:2", "Resume")
    assert "Key 'account:2' resumed by operator; 1 dispatched" in page.locator(".messagelist").inner_text()
    assert cell(page, "account:2", "paused") == "no" and cell(page, "account:2", "depth") == "0"
    assert KeyedTask.objects.get(pk=parked.pk).status == "dispatched"
    screenshot("2-resumed")

    with page.expect_navigation():
        release = f"Release {busy[0].task_id[:8]}…"
        page.locator('#live-keys tr[data-key="account:1"]').get_by_role("link", name=release).click()
    what = page.locator("#what-it-does").inner_text()
    assert "The released run is not stopped" in what and "fencing token 1" in what
    with page.expect_navigation():
        page.get_by_role("button", name="Yes, release").click()
    assert f"[{busy[0].task_id}]: Released by operator (redispatch)" in page.locator(".messagelist").inner_text()
    assert live_rows(page)[0:1] != [], "back on the live keys page"
    again = page.locator('tr[data-key="account:1"] .holder').inner_text()
    assert "dispatched, not started yet, attempt 2" in again and "#1" not in again, "dispatched again, named by task"
    assert KeyedTask.objects.get(pk=busy[0].pk).error == "released by operator; dispatched again"
    screenshot("3-released")

    press(page, "account:1", "Pause")
    assert cell(page, "account:1", "paused").startswith("paused by operator")
    assert [e.change_message for e in LogEntry.objects.order_by("id")] == [
        "Key 'account:2' resumed by operator; 1 dispatched",
        "Released by operator (redispatch)",
        "Key 'account:1' paused by operator",
    ]


def test_cancelling_and_retrying_tasks_from_the_list(gate_redis, logged_in, screenshot):
    page = logged_in
    first, waiting = submit("account:5", 1), submit("account:5", 2)
    failed = submit("account:6", 1)
    started = get_gate().start(Start("account:6", failed.ticket, 1))
    get_gate().finish(Finish("account:6", failed.ticket, started.token))
    KeyedTask.objects.filter(pk=failed.pk).update(status="failed", error="RuntimeError: card declined")

    page.goto(f"{LIST}?q=account%3A5")
    run_action(page, "Cancel the selected waiting tasks, or failed ones that block their keys", waiting)
    screenshot("1-cancelled")
    assert "Cancelled by operator" in page.locator(".messagelist").inner_text()
    assert KeyedTask.objects.get(pk=waiting.pk).status == "cancelled"
    assert get_gate().inspect("account:5").waiting == []
    assert KeyedTask.objects.get(pk=first.pk).status == "dispatched"

    page.goto(f"{LIST}?status=failed")
    retry = "Retry the selected failed tasks (at the end of their queues; one that blocks its key, first)"
    run_action(page, retry, failed)
    screenshot("2-retried")
    [again] = KeyedTask.objects.filter(key="account:6").exclude(pk=failed.pk)
    assert f"Retried by operator as {again.task_id}" in page.locator(".messagelist").inner_text()
    with page.expect_navigation():
        page.locator(".messagelist").get_by_role("link", name=again.task_id).click()
    assert page.locator(".field-retry_of_link").inner_text().endswith(failed.task_id), "the retry names what it retries"
    assert again.status == "dispatched" and again.arguments == failed.arguments


def test_a_task_page_draws_its_keys_timeline(gate_redis, logged_in, screenshot):
    page = logged_in
    tasks = [submit("account:7", n) for n in range(4)]
    gate = get_gate()
    for task in tasks[:2]:
        started = gate.start(Start("account:7", task.ticket, 1))
        gate.finish(Finish("account:7", task.ticket, started.token))
        at = KeyedTask.objects.get(pk=task.pk).enqueued_at
        KeyedTask.objects.filter(pk=task.pk).update(status="succeeded", started_at=at, finished_at=at)
    page.goto(f"{LIST}{tasks[2].pk}/change/")
    timeline = page.locator("#key-timeline svg")
    timeline.scroll_into_view_if_needed()
    screenshot("timeline")
    assert timeline.locator("g.timeline-task").count() == 4
    assert timeline.locator("g.timeline-current").get_attribute("data-task-id") == tasks[2].task_id
    assert timeline.locator("rect.run").count() == 2, "the two tasks that ran hold the key in the picture"
    with page.expect_navigation():
        page.get_by_role("link", name="This key live").click()
    assert live_rows(page) == ["account:7"]


def test_a_viewer_sees_the_keys_but_no_buttons(gate_redis, page, admin_server, screenshot):
    viewer = User.objects.create_user("viewer", password="a-long-test-password", is_staff=True)
    viewer.user_permissions.set(Permission.objects.filter(codename="view_keyedtask"))
    submit("account:8", 1)
    get_gate().pause("account:8")
    page.goto("/admin/login/?next=" + KEYS)
    page.fill("#id_username", "viewer")
    page.fill("#id_password", "a-long-test-password")
    with page.expect_navigation():
        page.click("input[type=submit]")
    screenshot("viewer")
    assert live_rows(page) == ["account:8"]
    assert page.locator("#live-keys button").count() == 0


def test_the_lists_release_shows_each_task_first_and_refuses_a_running_one(gate_redis, logged_in, screenshot):
    """A running holder selected with a task waiting behind it: the confirmation says, per task, why each
    is refused (the running one would run twice at once: Stop it), and offers nothing to confirm."""
    page = logged_in
    running, waiting = submit("account:8", 1), submit("account:8", 2)
    assert get_gate().start(Start("account:8", running.ticket, 1)).ok

    page.goto(f"{LIST}?q=account%3A8")
    for task in (running, waiting):
        page.locator(f'#result_list input[name="_selected_action"][value="{task.pk}"]').check()
    page.select_option('select[name="action"]', label="Release the selected running tasks' hold on their keys")
    with page.expect_navigation():
        page.click('button[name="index"]')
    screenshot("release-refused")
    rows = page.locator("#each-task tbody tr.refused")
    assert rows.count() == 2 and page.locator("#confirm").count() == 0, "nothing to confirm"
    said = rows.filter(has_text=running.task_id).inner_text()
    assert "two runs of one task at once" in said and "Stop it" in said
    assert "Release applies to none of the selected tasks now." in page.locator("#not-now").inner_text()
    assert get_gate().inspect("account:8").holders[running.ticket].state == "running"
