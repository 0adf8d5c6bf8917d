"""Run now from the task's page and ``keyed_queue_run_now``: a task waiting for a debounce, its key's rate
or its own eta starts now, once, and its waiting copy cannot start it again; any other is refused, with
nothing done."""

import io
import json
from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.core.management import CommandError, call_command
from django.urls import reverse
from django.utils import timezone

from django_keyed_queue.gate import Code, Finish, Start, Submission
from django_keyed_queue.messaging.message import HEADER, JOIN_HEADER
from django_keyed_queue.ops.actions import recovery
from django_keyed_queue.process.state import get_gate
from django_keyed_queue.records.models import KeyedTask
from django_keyed_queue.testing import write_submission_rows
from testproject.demo.tasks import slow_debounced_step, step
from tests.django.queues import QUEUE

pytestmark = pytest.mark.django_db

HOUR_MS = 3_600_000


def messages(broker) -> list[dict]:
    """The test queue's messages' headers, oldest first."""
    return [json.loads(raw)["headers"] for raw in reversed(broker.lrange(QUEUE, 0, -1))]


def row_of(result) -> KeyedTask:
    write_submission_rows()
    return KeyedTask.objects.get(task_id=result.id)


def act_url(task: KeyedTask, action: str) -> str:
    return reverse("admin:keyed_queue_task_act", args=[task.pk, action])


def run_now(task_id: str) -> str:
    out = io.StringIO()
    call_command("keyed_queue_run_now", task_id, stdout=out)
    return out.getvalue()


def test_a_debounced_task_runs_now_once_and_its_waiting_copy_is_dropped(gate_redis, broker, as_user):
    result = slow_debounced_step.apply_async(("d", 1), queue=QUEUE)
    task = row_of(result)
    [sent] = messages(broker)
    assert sent["eta"] and sent[HEADER]["dispatch"] == 1, "it waits out its debounce in the broker"
    client = as_user("dee", "run_now_keyedtask")
    page = client.get(reverse("admin:keyed_queue_keyedtask_change", args=[task.pk])).content.decode()
    assert act_url(task, "run_now") in page
    assert "starts now instead of waiting for its debounce" in client.get(act_url(task, "run_now")).content.decode()

    done = client.post(act_url(task, "run_now"), follow=True).content.decode()

    assert "Run now by dee" in done
    assert "an operator ran it now: a worker starts it at once" in done, "its page says so"
    [_, again] = messages(broker)
    assert (again["eta"], again[HEADER]["dispatch"], again["id"]) == (None, 2, result.id)
    assert get_gate().start(Start("d", task.ticket, 1)).code is Code.STALE_DISPATCH, "the waiting copy is dropped"
    refused = client.post(act_url(task, "run_now"), follow=True).content.decode()
    assert "it waits for no time" in refused or "waits for no time" in refused
    assert len(messages(broker)) == 2, "run now once"
    assert LogEntry.objects.filter(object_id=str(task.pk)).count() == 1
    assert get_gate().start(Start("d", task.ticket, 2)).ok


def test_a_task_waiting_for_its_keys_rate_runs_now(gate_redis, broker):
    first, second = (step.apply_async(("r", n), queue=QUEUE) for n in (1, 2))
    gate = get_gate()
    gate.set_overrides("r", interval_ms=HOUR_MS)  # an operator's rate: two an hour
    started = gate.start(Start("r", 1, 1, task_id=first.id))
    assert started.ok
    gate.finish(Finish("r", 1, started.token))
    assert gate.start(Start("r", 2, 1, task_id=second.id)).code is Code.TOO_EARLY

    said = run_now(second.id)

    assert said.startswith(f"testproject.demo.tasks.step[{second.id}] published again to start now (dispatch 2)")
    assert "instead of waiting for its key's rate" in said
    assert (messages(broker)[-1]["eta"], messages(broker)[-1][HEADER]["dispatch"]) == (None, 2)
    assert gate.start(Start("r", 2, 2, task_id=second.id)).ok, "it starts whatever the rate"
    with pytest.raises(CommandError, match="is running: only a task waiting for a time runs now"):
        run_now(second.id)


def test_a_delayed_task_joins_its_key_now_and_its_waiting_copy_is_refused(gate_redis, broker):
    result = step.apply_async(("e", 1), queue=QUEUE, countdown=3600)
    task = row_of(result)
    join_id = messages(broker)[0][JOIN_HEADER]
    assert task.ticket is None and task.due_at > timezone.now() + timedelta(minutes=50)

    said = run_now(result.id)

    assert "joins the queue of key 'e' now" in said
    now_copy = messages(broker)[-1]
    assert (now_copy["eta"], now_copy[JOIN_HEADER], now_copy["id"]) == (None, f"{join_id}:now", result.id)
    assert HEADER not in now_copy or now_copy[HEADER] is None
    assert get_gate().submit(Submission("e", b"old copy", join_id=join_id)) is None, (
        "the copy that waits for its eta is refused"
    )
    assert row_of(result).due_at <= timezone.now()
    with pytest.raises(CommandError, match="waits for no time|only a task waiting"):
        run_now(result.id)


@pytest.mark.parametrize("state", ["running", "waiting its turn", "dispatched"])
def test_a_task_waiting_for_no_time_is_refused_and_nothing_is_sent(gate_redis, broker, state):
    first, second = (step.apply_async(("n", n), queue=QUEUE) for n in (1, 2))
    write_submission_rows()
    if state == "running":
        assert get_gate().start(Start("n", 1, 1)).ok
    target = second if state == "waiting its turn" else first
    before = broker.llen(QUEUE)
    with pytest.raises(CommandError) as refused:
        run_now(target.id)
    said = {"running": "is running", "waiting its turn": "not for a time", "dispatched": "waits for no time"}[state]
    assert said in str(refused.value)
    assert broker.llen(QUEUE) == before


def test_a_released_debounced_task_is_not_published_again_before_its_eta(gate_redis, broker):
    result = slow_debounced_step.apply_async(("d", 1), queue=QUEUE)
    task = row_of(result)
    recovery.release("d", task.ticket, dispatch=1, by="dee")
    holder = get_gate().inspect("d").holders[task.ticket]
    assert holder.dispatch == 2 and holder.deadline_in > 500, "the reaper waits out its eta first"


def test_the_live_keys_page_offers_run_now_for_a_task_waiting_for_its_keys_rate(gate_redis, broker, as_user):
    first, second = (step.apply_async(("r", n), queue=QUEUE) for n in (1, 2))
    gate = get_gate()
    gate.set_overrides("r", interval_ms=HOUR_MS)
    started = gate.start(Start("r", 1, 1, task_id=first.id))
    gate.finish(Finish("r", 1, started.token))
    write_submission_rows()
    waiting = KeyedTask.objects.get(task_id=second.id)
    keys = reverse("admin:keyed_queue_keys")
    offer = f"Run now {second.id[:8]}…"
    assert offer not in as_user("vic", "view_keyedtask").get(keys).content.decode(), "only to who may"
    dee = as_user("dee", "view_keyedtask", "run_now_keyedtask")
    page = dee.get(keys).content.decode()
    assert f"{act_url(waiting, 'run_now')}?next=" in page and f"Run now {second.id[:8]}…" in page
    assert "It waits for its key&#x27;s rate" in page
    run_now(second.id)
    assert f"Run now {second.id[:8]}…" not in dee.get(keys).content.decode(), "run now once: not offered again"
