"""The admin's actions as an operator uses them: each needs its own permission and is logged."""

import json
import re
import time

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import User
from django.urls import reverse

from django_keyed_queue.gate import Finish, Lease, Start, Submission
from django_keyed_queue.messaging.message import HEADER, JOIN_HEADER, TaskMessage
from django_keyed_queue.process.state import current, get_gate
from django_keyed_queue.records.models import IdempotencyKey, KeyedTask
from django_keyed_queue.testing import write_submission_rows
from testproject.demo.tasks import charge, step
from tests.django.queues import QUEUE

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:keyed_queue_keyedtask_changelist"


def act(client, action: str, *tasks: KeyedTask):
    """The task list's action on ``tasks``, confirmed as an operator confirms it: the page it shows first, then
    its form posted back (the page itself when its form offers nothing to confirm, or it was refused)."""
    shown = confirmation(client, action, *tasks)
    form = re.search(r'<form method="post">(.*?)</form>', shown.content.decode(), re.S)
    if shown.status_code != 200 or form is None:
        return shown
    posted: dict[str, list[str]] = {}
    for name, value in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', form.group(1)):
        posted.setdefault(name, []).append(value)
    return client.post(reverse(CHANGELIST), posted, follow=True)


def confirmation(client, action: str, *tasks: KeyedTask):
    """What the task list's action says it will do, before anything is done."""
    return client.post(reverse(CHANGELIST), {"action": action, "_selected_action": [t.pk for t in tasks]}, follow=True)


def row(result) -> KeyedTask:
    write_submission_rows()  # as a worker does within KEYED_QUEUE_RECORD_FLUSH_SECONDS
    return KeyedTask.objects.get(task_id=result.id)


def published(broker) -> list[tuple[int, int]]:
    """(ticket, dispatch) of each message on the test queue, oldest first."""
    headers = [json.loads(raw)["headers"][HEADER] for raw in reversed(broker.lrange(QUEUE, 0, -1))]
    return [(h["ticket"], h["dispatch"]) for h in headers]


def test_cancel_withdraws_a_waiting_task_and_logs_who_did_it(gate_redis, broker, as_user):
    first, second = (step.apply_async(("k", n), queue=QUEUE) for n in (1, 2))
    client = as_user("carol", "cancel_keyedtask")
    response = act(client, "cancel_tasks", row(second))
    assert "Cancelled by carol" in response.content.decode()
    cancelled = row(second)
    assert (cancelled.status, cancelled.error) == ("cancelled", "cancelled by carol")
    assert cancelled.finished_at is not None
    assert get_gate().inspect("k").waiting == [], "it left the key's queue"
    entry = LogEntry.objects.get(object_id=str(cancelled.pk))
    assert (entry.user.username, entry.change_message) == ("carol", "Cancelled by carol")
    assert row(first).status == "dispatched"


def test_cancel_of_a_dispatched_task_passes_the_key_to_the_next(gate_redis, broker, as_user):
    first, second = (step.apply_async(("k", n), queue=QUEUE) for n in (1, 2))
    act(as_user("carol", "cancel_keyedtask"), "cancel_tasks", row(first))
    assert row(first).status == "cancelled"
    assert row(second).status == "dispatched"
    assert published(broker) == [(1, 1), (2, 1)]
    assert not get_gate().start(Start("k", 1, 1)).ok, "the cancelled task's message, if it arrives, does not run"
    assert get_gate().start(Start("k", 2, 1)).ok


def test_a_running_task_is_not_cancelled(gate_redis, broker, as_user):
    task = step.apply_async(("k", 1), queue=QUEUE)
    assert get_gate().start(Start("k", 1, 1)).ok
    response = act(as_user("carol", "cancel_keyedtask"), "cancel_tasks", row(task))
    assert f"Not done: task {task.id} is running: stop it instead." in response.content.decode()
    assert row(task).status == "dispatched" and not LogEntry.objects.exists()


def test_a_cancelled_delayed_task_never_joins_its_queue(gate_redis, broker, as_user):
    task = step.apply_async(("k", 1), queue=QUEUE, countdown=60)
    assert row(task).ticket is None and row(task).due_at is not None
    act(as_user("carol", "cancel_keyedtask"), "cancel_tasks", row(task))
    assert row(task).status == "cancelled"
    join_id = TaskMessage.decode(row(task).message.encode(), ["json"]).options["headers"][JOIN_HEADER]
    assert get_gate().submit(Submission("k", b"m", start=True, join_id=join_id)) is None, (
        "its join, when due, is refused"
    )


def test_retry_submits_a_failed_task_again_at_the_end_of_its_queue(gate_redis, broker, as_user):
    failed = charge.apply_async((7, "10.00"), queue=QUEUE)
    running = charge.apply_async((7, "99.00"), queue=QUEUE)
    write_submission_rows()
    KeyedTask.objects.filter(task_id=failed.id).update(status="failed", error="boom")
    response = act(as_user("rita", "retry_keyedtask"), "retry_tasks", row(failed))
    [again] = KeyedTask.objects.exclude(task_id__in=[failed.id, running.id])
    link = reverse("admin:keyed_queue_keyedtask_change", args=[again.pk])
    assert f'Retried by rita as <a href="{link}">{again.task_id}</a>' in response.content.decode()
    assert (again.key, again.arguments, again.status) == ("order:7", row(failed).arguments, "waiting")
    assert again.ticket == row(running).ticket + 1, "it rejoined its key's queue, at the end"
    assert row(failed).status == "failed", "the failed run's record stays as it was"
    # The idempotency key of the failed task now resolves to its retry.
    assert IdempotencyKey.objects.get(task_name=charge.name, task_id=again.task_id)
    assert charge.apply_async((7, "10.00"), queue=QUEUE).id == again.task_id
    assert LogEntry.objects.get(object_id=str(row(failed).pk)).change_message == f"Retried by rita as {again.task_id}"
    assert LogEntry.objects.get(object_id=str(again.pk)).change_message == f"Retry of {failed.id} by rita"


def test_only_failed_tasks_are_retried(gate_redis, broker, as_user):
    task = step.apply_async(("k", 1), queue=QUEUE)
    response = act(as_user("rita", "retry_keyedtask"), "retry_tasks", row(task))
    assert "only a failed task can be retried" in response.content.decode()
    assert KeyedTask.objects.count() == 1


def test_release_fences_a_stuck_holder_and_dispatches_it_again(gate_redis, broker, as_user):
    task = step.apply_async(("k", 1), queue=QUEUE)
    started = get_gate().start(Start("k", 1, 1, max_lost=3))
    response = as_user("rob", "release_keyedtask").post(
        reverse("admin:keyed_queue_key_act"), {"action": "release", "key": "k", "ticket": 1}, follow=True
    )
    assert "Ticket 1 of key &#x27;k&#x27; released by rob" in response.content.decode()
    assert not get_gate().holds(Lease("k", 1, started.token)), "the stuck run is fenced"
    assert published(broker) == [(1, 1), (1, 2)], "dispatched again, as the reaper would"
    assert get_gate().inspect("k").holders[1].state == "granted"
    record = row(task)
    assert (record.status, record.error) == ("dispatched", "released by rob; dispatched again")
    entry = LogEntry.objects.get()
    assert (entry.object_repr, entry.user.username) == ("key k", "rob")


def test_pause_and_resume_from_the_live_page(gate_redis, broker, as_user):
    client = as_user("pat", "pause_key", "resume_key")
    url = reverse("admin:keyed_queue_key_act")
    client.post(url, {"action": "pause", "key": "k"})
    tasks = [step.apply_async(("k", n), queue=QUEUE) for n in (1, 2)]
    assert published(broker) == [] and get_gate().paused_keys() == ["k"]
    page = client.get(reverse("admin:keyed_queue_keys")).content.decode()
    assert 'data-key="k"' in page and "paused" in page and 'value="resume"' in page
    client.post(url, {"action": "resume", "key": "k"})
    assert published(broker) == [(1, 1)] and row(tasks[0]).status == "dispatched"
    assert [e.change_message for e in LogEntry.objects.order_by("id")] == [
        "Key 'k' paused by pat",
        "Key 'k' resumed by pat; 1 dispatched",
    ]


@pytest.mark.parametrize(
    "action, form",
    [
        ("pause", {"key": "k"}),
        ("resume", {"key": "k"}),
        ("release", {"key": "k", "ticket": 1}),
    ],
)
def test_key_actions_need_their_own_permission(gate_redis, broker, as_user, action, form):
    step.apply_async(("k", 1), queue=QUEUE)
    get_gate().start(Start("k", 1, 1))
    others = [c for c in ("pause_key", "resume_key", "release_keyedtask") if not c.startswith(action)]
    client = as_user("vic", *others)
    before = gate_redis.hgetall("keyed_queue:{k}:holders"), get_gate().paused_keys()
    response = client.post(reverse("admin:keyed_queue_key_act"), {"action": action, **form})
    assert response.status_code == 403
    assert (gate_redis.hgetall("keyed_queue:{k}:holders"), get_gate().paused_keys()) == before
    assert not LogEntry.objects.exists()
    page = client.get(reverse("admin:keyed_queue_keys")).content.decode()
    assert f'value="{action}"' not in page, "the button is not shown either"


@pytest.mark.parametrize(
    "action, permission",
    [
        ("cancel_tasks", "cancel_keyedtask"),
        ("retry_tasks", "retry_keyedtask"),
        ("release_holders", "release_keyedtask"),
    ],
)
def test_task_actions_need_their_own_permission(gate_redis, broker, as_user, action, permission):
    task = step.apply_async(("k", 1), queue=QUEUE)
    write_submission_rows()
    KeyedTask.objects.filter(task_id=task.id).update(status="failed")
    others = [c for c in ("cancel_keyedtask", "retry_keyedtask", "release_keyedtask") if c != permission]
    client = as_user("vic", *others)
    page = client.get(reverse(CHANGELIST)).content.decode()
    assert f'value="{action}"' not in page
    assert act(client, action, row(task)).status_code == 403, "a forced POST is told, not ignored"
    assert KeyedTask.objects.count() == 1 and row(task).status == "failed"
    assert not LogEntry.objects.exists()
    assert published(broker) == [(1, 1)]


def test_the_live_page_needs_the_view_permission(client, gate_redis):
    client.force_login(User.objects.create_user("nobody", password="pw", is_staff=True))
    assert client.get(reverse("admin:keyed_queue_keys")).status_code == 403
    client.logout()
    assert client.get(reverse("admin:keyed_queue_keys")).status_code == 302, "to the login page"


def test_the_live_page_puts_stuck_keys_first(gate_redis, broker, as_user, settings):
    settings.KEYED_QUEUE_LEASE_SECONDS = 0.05
    settings.KEYED_QUEUE_REAP_INTERVAL_SECONDS = 0.01  # stuck once overdue for the reaper by 0.02 s
    current().reset_gate()
    try:
        for key in ("waits-long", "overdue", "quiet"):
            step.apply_async((key, 1), queue=QUEUE)
        step.apply_async(("waits-long", 2), queue=QUEUE)
        assert get_gate().start(Start("overdue", 1, 1)).ok  # its lease runs out at once: no worker renews it
        get_gate().pause("paused-idle")
        time.sleep(0.1)
        page = as_user("olga").get(reverse("admin:keyed_queue_keys")).content.decode()
    finally:
        current().reset_gate()
    # Stuck, then blocked and paused keys, then the longest wait ("quiet"'s task waits for a worker, not long).
    order = [k for k in ("overdue", "paused-idle", "waits-long", "quiet") if f'data-key="{k}"' in page]
    assert order == ["overdue", "paused-idle", "waits-long", "quiet"]
    positions = [page.index(f'data-key="{k}"') for k in order]
    assert positions == sorted(positions), page
    assert "overdue by " in page


def test_the_task_page_draws_its_keys_timeline(gate_redis, broker, as_user):
    tasks = [step.apply_async(("k", n), queue=QUEUE) for n in range(3)]
    gate = get_gate()
    started = gate.start(Start("k", 1, 1))
    gate.finish(Finish("k", 1, started.token))
    at = row(tasks[0]).enqueued_at
    write_submission_rows()
    KeyedTask.objects.filter(task_id=tasks[0].id).update(status="succeeded", started_at=at, finished_at=at)
    page = as_user("tim").get(reverse("admin:keyed_queue_keyedtask_change", args=[row(tasks[1]).pk])).content
    page = page.decode()
    assert page.count('class="timeline-task') == 3
    assert f'class="timeline-task timeline-current" data-task-id="{tasks[1].id}"' in page
    assert page.count('class="run"') == 1, "only the task that ran has a run bar"


def test_records_cannot_be_edited_and_unfinished_ones_not_deleted(gate_redis, broker, admin_client):
    active = row(step.apply_async(("k", 1), queue=QUEUE))
    page = admin_client.get(reverse("admin:keyed_queue_keyedtask_change", args=[active.pk])).content.decode()
    assert 'name="_save"' not in page, "a record is read only"
    assert admin_client.post(reverse("admin:keyed_queue_keyedtask_delete", args=[active.pk])).status_code == 403
    assert 'value="delete_selected"' not in admin_client.get(reverse(CHANGELIST)).content.decode()
    KeyedTask.objects.filter(pk=active.pk).update(status="succeeded")
    admin_client.post(reverse("admin:keyed_queue_keyedtask_delete", args=[active.pk]), {"post": "yes"})
    assert not KeyedTask.objects.filter(pk=active.pk).exists(), "a finished record can go"


@pytest.mark.parametrize(
    "form",
    [{"action": "explode", "key": "k"}, {"action": "pause"}, {"action": "release", "key": "k", "ticket": "one"}],
)
def test_a_malformed_key_action_is_a_bad_request(gate_redis, admin_client, form):
    assert admin_client.post(reverse("admin:keyed_queue_key_act"), form).status_code == 400
    assert get_gate().paused_keys() == [] and not LogEntry.objects.exists()


def test_an_unreachable_redis_is_told_to_the_operator(gate_redis, broker, admin_client, settings):
    task = row(step.apply_async(("k", 1), queue=QUEUE))
    settings.KEYED_QUEUE_REDIS_URL = "redis://127.0.0.1:1/0"
    current().reset_gate()
    try:
        page = admin_client.get(reverse("admin:keyed_queue_keys")).content.decode()
        assert "The keyed queue&#x27;s Redis did not answer" in page
        response = admin_client.post(reverse("admin:keyed_queue_key_act"), {"action": "pause", "key": "k"}, follow=True)
        assert "The keyed queue&#x27;s Redis did not answer" in response.content.decode()
        response = act(admin_client, "cancel_tasks", task)
        assert "The keyed queue&#x27;s Redis did not answer" in response.content.decode()
    finally:
        current().reset_gate()
    assert KeyedTask.objects.get(pk=task.pk).status == "dispatched" and not LogEntry.objects.exists()


def blocked_by_failure(gate_redis) -> tuple:
    """Key "k": step 1 failed for good and blocks it (``on_failure="block"``), step 2 waits behind it."""
    first, second = step.apply_async(("k", 1), queue=QUEUE), step.apply_async(("k", 2), queue=QUEUE)
    gate = get_gate()
    started = gate.start(Start("k", 1, 1, block=True))
    assert gate.finish(Finish("k", 1, started.token, block=True)).code.name == "BLOCKED"
    write_submission_rows()
    KeyedTask.objects.filter(task_id=first.id).update(status="failed", attempts=1, error="boom")  # as its worker did
    return first, second


def test_retry_runs_a_task_that_blocks_its_key_again_first(gate_redis, broker, as_user):
    failed, waiting = blocked_by_failure(gate_redis)
    response = act(as_user("rita", "retry_keyedtask"), "retry_tasks", row(failed))
    assert f"[{failed.id}]: Retried by rita first on its key" in response.content.decode()
    assert published(broker) == [(1, 1), (1, 2)], "its own message again, with the next dispatch"
    again = row(failed)
    assert (again.status, again.attempts, again.error) == ("dispatched", 2, "retried first by rita")
    [kept] = again.notes.splitlines()
    assert kept.startswith("attempt 1") and kept.endswith(": failed (boom); retried first by rita"), "its error kept"
    assert get_gate().inspect("k").blocked is None
    assert row(waiting).status == "waiting", "the key's next task still waits behind it"
    assert KeyedTask.objects.count() == 2, "no new task"


def test_cancel_of_a_task_that_blocks_its_key_lets_the_next_run(gate_redis, broker, as_user):
    failed, waiting = blocked_by_failure(gate_redis)
    response = act(as_user("carl", "cancel_keyedtask"), "cancel_tasks", row(failed))
    assert f"[{failed.id}]: Cancelled by carl" in response.content.decode()
    assert published(broker) == [(1, 1), (2, 1)], "the next task dispatched"
    cancelled = row(failed)
    assert cancelled.status == "cancelled" and cancelled.error.endswith("boom")
    assert row(waiting).status == "dispatched"


def test_the_live_page_shows_a_blocked_key_first_with_the_task_that_blocks_it(gate_redis, broker, as_user):
    step.apply_async(("quiet", 1), queue=QUEUE)
    failed, _ = blocked_by_failure(gate_redis)
    KeyedTask.objects.filter(key="k").exclude(task_id=failed.id).update(status="cancelled")  # only the failure left

    page = as_user("olga").get(reverse("admin:keyed_queue_keys")).content.decode()
    assert 'class="live-key stuck" data-key="k"' in page
    assert page.index('data-key="k"') < page.index('data-key="quiet"')
    assert f"blocked by failed task {failed.task_id[:8]}: retry or cancel it" in page
    assert f"Release {failed.task_id[:8]}" not in page, "a blocked holder is retried or cancelled, not released"


def test_the_release_command_releases_the_key_s_only_holder(gate_redis, broker):
    from io import StringIO

    from django.core.management import call_command

    result = step.apply_async(("k", 1), queue=QUEUE)
    get_gate().start(Start("k", 1, 1, max_lost=3))
    out = StringIO()
    call_command("keyed_queue_release", "k", stdout=out)
    named = f"testproject.demo.tasks.step[{result.id}]"
    assert out.getvalue() == f"released {named} (ticket 1) of key 'k': redispatch (attempt 1, dispatch 2)\n"
    assert published(broker) == [(1, 1), (1, 2)]
