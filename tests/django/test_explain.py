"""Why a task waits: ``explain(task_id)`` and ``keyed_queue_status --task``, against the gate's real state."""

import io
import json
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from django_keyed_queue import ActionRefused, explain, keyed_serial_task
from django_keyed_queue.process.state import get_gate
from django_keyed_queue.records.models import KeyedTask
from django_keyed_queue.testing import write_submission_rows
from testproject.demo.tasks import step
from tests.django.queues import QUEUE

pytestmark = pytest.mark.django_db


@keyed_serial_task(key="{key}", rate="1/m", name="tests.explain_paced")
def paced(key: str, n: int) -> int:
    return n


def status(*args) -> str:
    out = io.StringIO()
    call_command("keyed_queue_status", *args, stdout=out)
    return out.getvalue()


def submit(key: str, *ns: int) -> list[str]:
    ids = [step.apply_async((key, n), queue=QUEUE).id for n in ns]
    write_submission_rows()
    return ids


def start_as_a_worker(key: str, ticket: int, task_id: str, worker: str = "celery@host-a") -> None:
    """The gate's start, and the record its worker writes."""
    assert get_gate().start(key, ticket, 1, task_id=task_id).ok
    KeyedTask.objects.filter(task_id=task_id).update(
        status="running", started_at=timezone.now() - timedelta(seconds=95), worker=worker, attempts=1
    )


def test_a_task_behind_a_running_one_names_it_its_worker_and_its_place(gate_redis, broker):
    first, second, third = submit("account:6", 1, 2, 3)
    start_as_a_worker("account:6", 1, first)

    why = explain(third)
    assert why.state == "waiting" and why.waits
    assert why.waiting_ahead == 1, "the second task waits ahead of it"
    [holder] = why.holders
    assert (holder.ticket, holder.state, holder.task.task_id) == (1, "running", first)
    assert f"step[{first}]".replace("step", "testproject.demo.tasks.step") in why.reasons[0]
    assert "running for 1 min 35 s on celery@host-a" in why.reasons[0]
    assert why.reasons[-1] == "1 task of the key waits ahead of it"
    assert explain(second).reasons[-1] == "it is next in its key's queue"

    mine = explain(first)
    assert mine.state == "running" and not mine.waits and mine.holders == []
    assert "running for 1 min 35 s on celery@host-a" in mine.reasons[0]


def test_a_paused_key_says_who_paused_it_and_since_when(gate_redis, broker):
    call_command("keyed_queue_pause", "account:7", stdout=io.StringIO())
    [task_id] = submit("account:7", 1)

    why = explain(task_id)
    assert why.paused and "manage.py keyed_queue_pause" in why.paused_by
    assert why.paused_since is not None and abs((timezone.now() - why.paused_since).total_seconds()) < 5
    assert why.reasons[0].startswith(f"its key is paused by {why.paused_by} since ")
    assert "nothing of it starts until it is resumed" in why.reasons[0]

    call_command("keyed_queue_resume", "account:7", stdout=io.StringIO())
    resumed = explain(task_id)
    assert not resumed.paused and resumed.paused_by == "" and resumed.state == "dispatched"
    assert resumed.reasons[0].startswith("it holds its key: dispatched ")


def test_a_task_behind_a_failed_task_that_blocks_its_key_names_that_task(gate_redis, broker):
    failed, waiting = submit("k", 1, 2)
    gate = get_gate()
    started = gate.start("k", 1, 1, block=True)
    assert gate.finish("k", 1, started.token, block=True).code.name == "BLOCKED"
    KeyedTask.objects.filter(task_id=failed).update(status="failed", attempts=1, error="boom")

    why = explain(waiting)
    assert why.blocked_by is not None and why.blocked_by.task.task_id == failed
    assert why.reasons[0].startswith(f"testproject.demo.tasks.step[{failed}] (#1) failed and blocks the key")
    assert why.as_data()["blocked_by"]["task_id"] == failed
    assert explain(failed).state == "failed", "its record says how it ended"


def test_a_delayed_task_says_when_it_is_due(gate_redis, broker):
    task_id = step.apply_async(("k", 1), queue=QUEUE, countdown=600).id
    write_submission_rows()
    why = explain(task_id)
    assert why.state == "not due yet" and why.due_at is not None
    assert "(in 9 min 59 s)" in why.reasons[0] or "(in 10 min 0 s)" in why.reasons[0]


def test_the_status_command_explains_a_task_in_words_and_as_json(gate_redis, broker):
    first, second = submit("k", 1, 2)
    start_as_a_worker("k", 1, first)
    words = status("--task", second)
    assert words.splitlines()[0] == f"testproject.demo.tasks.step[{second}] key 'k': waiting"
    assert "  - it is next in its key's queue" in words
    data = json.loads(status("--task", second, "--json"))
    assert data["holders"][0]["task_id"] == first and data["waiting_ahead"] == 0
    assert data["holders"][0]["worker"] == "celery@host-a"


@pytest.mark.parametrize("task_id", ["no-such-task", "x" * 300, "nul\x00"])
def test_an_unknown_task_is_refused_by_name(gate_redis, task_id):
    with pytest.raises(ActionRefused, match="no keyed task has the id"):
        explain(task_id)
    with pytest.raises(CommandError, match="no keyed task has the id"):
        status("--task", task_id)


def test_the_status_command_refuses_a_key_and_a_task_together(gate_redis):
    with pytest.raises(CommandError, match="not both"):
        status("--task", "a", "--key", "k")
    with pytest.raises(CommandError, match="--json goes with --task"):
        status("--json")


def test_a_granted_task_of_a_paced_key_says_when_its_rate_lets_it_start(gate_redis, broker):
    first, second = (paced.apply_async(("r", n), queue=QUEUE).id for n in (1, 2))
    write_submission_rows()
    gate = get_gate()
    started = gate.start("r", 1, 1, task_id=first, interval_ms=60_000)  # the key's last start: now
    assert gate.finish("r", 1, started.token).granted, "the second is granted at once, to start when due"

    why = explain(second)
    assert why.state == "dispatched" and why.next_slot_in is not None and 55 < why.next_slot_in <= 60
    assert why.reasons[1].startswith("its key's rate lets the next task start in ")
    assert why.as_data()["next_slot_in"] == why.next_slot_in
