"""The task list's actions on many selected tasks: each shows what it will do to each task before it does
it (as Django's delete action does), by the rules of the task page's own action (``task_actions``), and
tells what it did and refused in one message. A Release from the list never starts a running task again
beside its run."""

import pytest
from django.contrib.admin.models import LogEntry

from django_keyed_queue import ActionRefused
from django_keyed_queue.gate import Lease, Start
from django_keyed_queue.ops.actions import task_actions
from django_keyed_queue.process.state import get_gate
from django_keyed_queue.records.models import KeyedTask
from django_keyed_queue.testing import write_submission_rows
from testproject.demo.tasks import step
from tests.django.queues import QUEUE
from tests.django.test_admin_actions import act, confirmation, published, row

pytestmark = pytest.mark.django_db


def test_a_list_action_shows_what_it_does_to_each_task_and_does_nothing_until_confirmed(gate_redis, broker, as_user):
    running, waiting = (step.apply_async(("k", n), queue=QUEUE) for n in (1, 2))
    assert get_gate().start(Start("k", 1, 1)).ok
    client = as_user("carol", "cancel_keyedtask")

    shown = confirmation(client, "cancel_tasks", row(running), row(waiting)).content.decode()
    assert "Cancel 1 of the 2 selected tasks?" in shown
    assert f"{step.name}[{waiting.id}]" in shown and "leaves the queue of key" in shown
    assert f"Not done: task {running.id} is running: stop it instead." in shown, "the action's own refusal"
    assert row(waiting).status == "waiting" and not LogEntry.objects.exists(), "showing it did nothing"

    done = act(client, "cancel_tasks", row(running), row(waiting)).content.decode()
    assert "Cancel done to 1 of 1 tasks." in done and "Cancelled by carol" in done
    assert (row(waiting).status, row(running).status) == ("cancelled", "dispatched")
    assert [entry.object_id for entry in LogEntry.objects.all()] == [str(row(waiting).pk)]


def test_a_list_release_of_a_running_task_is_refused_and_a_dispatched_one_is_released(gate_redis, broker, as_user):
    running, other = step.apply_async(("k", 1), queue=QUEUE), step.apply_async(("j", 1), queue=QUEUE)
    started = get_gate().start(Start("k", 1, 1, max_lost=3))
    client = as_user("rob", "release_keyedtask", "stop_keyedtask")

    shown = confirmation(client, "release_holders", row(running), row(other)).content.decode()
    assert f"task {running.id} is running: released, it would be dispatched again while its run goes on" in shown
    done = act(client, "release_holders", row(running), row(other)).content.decode()
    assert "Release done to 1 of 1 tasks." in done
    assert get_gate().holds(Lease("k", 1, started.token)), "the running task was left running"
    assert get_gate().inspect("j").holders[1].dispatch == 2, "the dispatched one went out again"


def test_a_task_that_started_after_the_list_showed_it_dispatched_is_not_released(gate_redis, broker, as_user):
    task = row(step.apply_async(("k", 1), queue=QUEUE))
    [proposal] = [task_actions.propose("release", task, many=True)]
    assert proposal.applies and proposal.seen == {"ticket": 1, "dispatch": 1}
    started = get_gate().start(Start("k", 1, 1))  # a worker starts it as the operator confirms

    with pytest.raises(ActionRefused, match=f"task {task.task_id} is running: released, it would be dispatched"):
        task_actions.perform("release", task, "rob", proposal.seen, many=True)
    assert get_gate().holds(Lease("k", 1, started.token)) and published(broker) == [(1, 1)]
    assert task_actions.perform("release", task, "rob", proposal.seen)[0].startswith("Released by rob"), (
        "the page's own release, which says what it does, still frees it"
    )


def test_a_list_retry_of_many_failed_tasks_is_told_in_one_message(gate_redis, broker, as_user):
    results = [step.apply_async((f"acct:{n}", n), queue=QUEUE) for n in range(40)]
    write_submission_rows()
    KeyedTask.objects.filter(task_id__in=[r.id for r in results[:39]]).update(status="failed", error="boom")
    tasks = [row(r) for r in results]
    client = as_user("rita", "retry_keyedtask")

    shown = confirmation(client, "retry_tasks", *tasks).content.decode()
    assert "Retry 39 of the 40 selected tasks?" in shown and "Yes, retry these 39 tasks" in shown
    response = act(client, "retry_tasks", *tasks)
    messages = [str(m) for m in response.context["messages"]]
    assert len(messages) == 1 and messages[0].startswith("Retry done to 39 of 39 tasks.")
    assert KeyedTask.objects.exclude(retried_as="").count() == 39


def test_a_list_pause_shows_what_it_does_to_each_key_first(gate_redis, broker, as_user):
    tasks = [row(step.apply_async((key, 1), queue=QUEUE)) for key in ("a", "b")]
    get_gate().pause("b", by="pat")
    client = as_user("pat", "pause_key", "resume_key")

    shown = confirmation(client, "pause_keys", *tasks).content.decode()
    assert "Pause 1 of the 2 selected keys?" in shown and "Key &#x27;a&#x27; dispatches nothing new" in shown
    assert "Not done: key &#x27;b&#x27; is paused already." in shown
    assert get_gate().paused_keys() == ["b"], "showing it did nothing"
    done = act(client, "pause_keys", *tasks).content.decode()
    assert "Key &#x27;a&#x27; paused by pat" in done and sorted(get_gate().paused_keys()) == ["a", "b"]

    resumed = act(client, "resume_keys", *tasks).content.decode()
    assert "Key &#x27;a&#x27; resumed by pat" in resumed and get_gate().paused_keys() == []
