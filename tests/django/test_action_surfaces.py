"""Each operator action's rules have one home, which every surface calls: a task that an action does not
apply to is refused in the same words by the API (``django_keyed_queue.cancel`` and the others), its
management command, the task's page (where the live keys page's links lead too) and the task list's
action, and none of them changes anything; an action that applies has the same effect from each.
"""

import html
import re

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse

from django_keyed_queue import ActionRefused, cancel, release, retry, run_now, stop
from django_keyed_queue.gate import Start
from django_keyed_queue.ops.actions import task_actions
from django_keyed_queue.process.state import get_gate
from django_keyed_queue.records.models import KeyedTask
from django_keyed_queue.records.statuses import Status
from django_keyed_queue.testing import write_submission_rows
from testproject.demo.tasks import step
from tests.django.queues import QUEUE
from tests.django.test_admin_actions import act, confirmation

pytestmark = pytest.mark.django_db

TASK_PAGE = "admin:keyed_queue_task_act"
#: The task list's action of each action it does to many tasks.
LIST_ACTIONS = {"cancel": "cancel_tasks", "retry": "retry_tasks", "release": "release_holders"}


def row_of(result) -> KeyedTask:
    write_submission_rows()
    return KeyedTask.objects.get(task_id=result.id)


def said_by_the_api(action: str, task: KeyedTask) -> str:
    call = {
        "retry": lambda: retry(task.task_id, by="ops"),
        "cancel": lambda: cancel(task.task_id, by="ops"),
        "stop": lambda: stop(task.task_id, by="ops"),
        "run_now": lambda: run_now(task.task_id, by="ops"),
        "release": lambda: release(task.key, task.ticket, task_id=task.task_id, by="ops"),
    }[action]
    with pytest.raises(ActionRefused) as refused:
        call()
    return str(refused.value)


def said_by_the_command(action: str, task: KeyedTask) -> str:
    arguments = [task.key, "--ticket", str(task.ticket)] if action == "release" else [task.task_id]
    with pytest.raises(CommandError) as refused:
        call_command(f"keyed_queue_{action}", *arguments)
    return str(refused.value)


def said_by_the_task_page(client, action: str, task: KeyedTask) -> str:
    page = client.get(reverse(TASK_PAGE, args=[task.pk, action])).content.decode()
    found = re.search(r'<p id="not-now" class="errornote">(.*?)</p>', page, re.S)
    assert found, f"the page of {action} offers it: {page[:300]}"
    assert 'type="submit"' not in page.split('id="not-now"', 1)[1], "a refused action offers no button"
    return html.unescape(found.group(1)).strip()


def said_by_the_task_list(client, action: str, task: KeyedTask) -> str:
    shown = confirmation(client, LIST_ACTIONS[action], task).content.decode()
    found = re.search(r'<p class="errornote">Not done: (.*?)\.</p>', shown, re.S)
    text = re.sub(r"<[^>]+>", " ", shown.split('id="content"', 1)[-1])
    assert found, f"the list's {action} offers it: {' '.join(text.split())[:600]}"
    return html.unescape(found.group(1)).strip()


def state_of(task: KeyedTask, broker):
    """What an action would change: the task's record, its key's queue and slots, the messages sent."""
    key = get_gate().inspect(task.key)
    slots = {t: (h.state, h.dispatch, h.token, h.attempts, h.stopping) for t, h in key.holders.items()}
    return KeyedTask.objects.get(pk=task.pk).status, key.waiting, slots, broker.llen(QUEUE)


def assert_refused_alike_everywhere(client, broker, action: str, task: KeyedTask, refusal: str) -> None:
    before = state_of(task, broker)
    api = said_by_the_api(action, task)
    assert refusal in api, api
    said = {"command": said_by_the_command(action, task), "task page": said_by_the_task_page(client, action, task)}
    if action in task_actions.MANY:
        said["task list"] = said_by_the_task_list(client, action, task)
    expected = {
        "command": api if action != "release" else api.replace(f" for task {task.task_id}", ""),  # names no task
        "task page": f"{task_actions.VERBS[action]} does not apply now: {api}.",
        "task list": api,
    }
    assert said == {surface: expected[surface] for surface in said}
    assert state_of(task, broker) == before, "a refusal changes nothing"


def test_a_task_that_did_not_fail_is_refused_a_retry_alike_on_every_surface(gate_redis, broker, admin_client):
    waiting = row_of(step.apply_async(("k", 1), queue=QUEUE))
    assert_refused_alike_everywhere(admin_client, broker, "retry", waiting, "only a failed task can be retried")


def test_a_running_task_is_refused_a_cancel_alike_on_every_surface(gate_redis, broker, admin_client):
    running = row_of(step.apply_async(("k", 1), queue=QUEUE))
    assert get_gate().start(Start("k", 1, 1, task_id=running.task_id)).ok
    assert_refused_alike_everywhere(
        admin_client, broker, "cancel", running, f"task {running.task_id} is running: stop it"
    )


def test_a_task_waiting_its_turn_is_refused_stop_release_and_run_now_alike_on_every_surface(
    gate_redis, broker, admin_client
):
    step.apply_async(("k", 1), queue=QUEUE)
    behind = row_of(step.apply_async(("k", 2), queue=QUEUE))
    assert_refused_alike_everywhere(admin_client, broker, "stop", behind, "only a running task is stopped")
    assert_refused_alike_everywhere(admin_client, broker, "release", behind, "holds no slot")
    assert_refused_alike_everywhere(admin_client, broker, "run_now", behind, "waits for its key's earlier tasks")


def failed(key: str) -> KeyedTask:
    """A task of ``key`` whose record says it failed."""
    task = row_of(step.apply_async((key, 1), queue=QUEUE))
    KeyedTask.objects.filter(pk=task.pk).update(status=Status.FAILED, attempts=1, error="card declined")
    return KeyedTask.objects.get(pk=task.pk)


@pytest.mark.parametrize("surface", ["api", "command", "task page", "task list"])
def test_retry_and_cancel_have_the_same_effect_from_every_surface(gate_redis, broker, admin_client, surface):
    to_retry, waiting = failed("r"), row_of(step.apply_async(("c", 1), queue=QUEUE))
    step.apply_async(("c", 2), queue=QUEUE)
    for action, task in (("retry", to_retry), ("cancel", waiting)):
        if surface == "api":
            (retry if action == "retry" else cancel)(task.task_id, by="ops")
        elif surface == "command":
            call_command(f"keyed_queue_{action}", task.task_id)
        elif surface == "task page":
            admin_client.post(reverse(TASK_PAGE, args=[task.pk, action]), follow=True)
        else:
            act(admin_client, LIST_ACTIONS[action], task)
    write_submission_rows()
    [again] = KeyedTask.objects.filter(retry_of=to_retry.task_id)
    assert KeyedTask.objects.get(pk=to_retry.pk).retried_as == again.task_id
    assert (again.key, again.status, again.arguments) == ("r", Status.WAITING, to_retry.arguments), "behind its key's"
    assert KeyedTask.objects.get(pk=waiting.pk).status == Status.CANCELLED
    assert [t for t, h in get_gate().inspect("c").holders.items() if h.state == "granted"] == [2], "the next runs"
