"""Why a task waits: ``explain(task_id)`` and ``keyed_queue_status --task``, against the gate's real state."""

import io
import json
import time
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from django_keyed_queue import ActionRefused, explain, keyed_serial_task
from django_keyed_queue.gate import Finish, Lease, Start
from django_keyed_queue.process.state import current, get_gate
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


def start_as_a_worker(key: str, ticket: int, task_id: str, worker: str = "celery@host-a", **start: object) -> Lease:
    """The gate's start, and the record its worker writes; the run's lease."""
    started = get_gate().start(Start(key, ticket, 1, task_id=task_id, **start))
    assert started.ok
    KeyedTask.objects.filter(task_id=task_id).update(
        status="running", started_at=timezone.now() - timedelta(seconds=95), heartbeat_at=timezone.now(),
        worker=worker, attempts=1,
    )  # fmt: skip
    return Lease(key, ticket, started.token)


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
    # Last: a grant dispatched over 10 s ago (a loaded machine) is first checked against the workers' queues.
    assert resumed.reasons[-1].startswith("it holds its key: dispatched ")


def test_a_task_behind_a_failed_task_that_blocks_its_key_names_that_task(gate_redis, broker):
    failed, waiting = submit("k", 1, 2)
    gate = get_gate()
    started = gate.start(Start("k", 1, 1, block=True))
    assert gate.finish(Finish("k", 1, started.token, block=True)).code.name == "BLOCKED"
    KeyedTask.objects.filter(task_id=failed).update(status="failed", attempts=1, error="boom")

    why = explain(waiting)
    assert why.blocked_by is not None and why.blocked_by.task.task_id == failed
    assert why.reasons[0].startswith(f"testproject.demo.tasks.step[{failed}] failed and blocks the key")
    assert why.as_data()["blocked_by"]["task_id"] == failed
    own = explain(failed)
    assert own.state == "failed, blocking its key", "its record says how it ended, and that it blocks its key"
    assert own.reasons[0].startswith("it blocks its key (on_failure='block')") and "error: boom" in own.reasons


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
    started = gate.start(Start("r", 1, 1, task_id=first, interval_ms=60_000))  # the key's last start: now
    assert gate.finish(Finish("r", 1, started.token)).granted, "the second is granted at once, to start when due"

    why = explain(second)
    assert why.state == "dispatched" and why.next_slot_in is not None and 55 < why.next_slot_in <= 60
    assert why.reasons[0].startswith("it starts at "), "the time it may start, first"
    assert why.reasons[0].endswith(": its key's rate is 1/m")
    assert why.reasons[-1].endswith("not started by a worker yet")
    assert why.as_data()["next_slot_in"] == why.next_slot_in


@pytest.fixture
def short_lease(settings):
    """A 3 s lease, renewed every second: a worker that stops renewing is told lost after 2 s."""
    settings.KEYED_QUEUE_LEASE_SECONDS = 3
    current().reset_gate()
    yield
    current().reset_gate()


def unrenewed_for(seconds: float, key: str, ticket: int, task_id: str, **start: object) -> Lease:
    """The gate starts the ticket as a worker would, which then renews it no more for ``seconds``."""
    lease = start_as_a_worker(key, ticket, task_id, **start)
    time.sleep(seconds)
    return lease


def test_a_run_whose_worker_stopped_renewing_is_told_first_by_its_lease_s_deadline(gate_redis, broker, short_lease):
    first, second = submit("account:8", 1, 2)
    unrenewed_for(2.3, "account:8", 1, first, max_lost=3)

    mine = explain(first)
    assert mine.reasons[0].startswith("its worker celery@host-a last renewed its lease 2."), mine.reasons
    assert "ago and may be lost; " in mine.reasons[0]
    assert "the reaper dispatches it again at its lease's end, in " in mine.reasons[0]
    assert mine.reasons[1].startswith("it holds its key: running for 1 min 3"), "since its start"
    behind = explain(second)
    assert "last renewed its lease" in behind.reasons[0], "the task waiting behind it is told too"


def test_a_renewed_lease_is_not_told_lost_whatever_the_record_says(gate_redis, broker, short_lease):
    [task_id] = submit("account:12", 1)
    lease = unrenewed_for(1.2, "account:12", 1, task_id)
    assert get_gate().renew([lease]) == {lease: True}
    time.sleep(1.1)  # 2.3 s after the start, 1.1 s after the renewal
    KeyedTask.objects.filter(task_id=task_id).update(heartbeat_at=timezone.now() - timedelta(minutes=5))
    assert explain(task_id).reasons[0].startswith("it holds its key: running"), "the gate's deadline is the truth"


def test_a_lost_run_with_no_recovery_left_is_told_it_fails(gate_redis, broker, short_lease):
    [task_id] = submit("account:13", 1)
    unrenewed_for(2.3, "account:13", 1, task_id, max_lost=0, block=True)
    reason = explain(task_id).reasons[0]
    assert "may be lost; the reaper fails it (no recovery left), and it blocks its key at its lease's end" in reason


def test_a_run_whose_process_celery_reported_lost_says_so_first(gate_redis, broker):
    from billiard.exceptions import WorkerLostError

    from django_keyed_queue.worker.attempt_errors import note_lost_process

    [task_id] = submit("account:10", 1)
    start_as_a_worker("account:10", 1, task_id, max_lost=3)  # a task's default max_recoveries
    lost = WorkerLostError("Worker exited prematurely: signal 9 (SIGKILL) Job: 3.")
    assert not note_lost_process(task_id, {"key": "account:10", "ticket": 1}, lost), "no attempt named: nothing"
    assert note_lost_process(task_id, {"key": "account:10", "ticket": 1, "dispatch": 1}, lost)
    assert note_lost_process(task_id, None, lost), "no request (Celery 5.4): the attempt its slot runs now"
    assert not note_lost_process("another-task", None, lost)

    why = explain(task_id)
    assert why.reasons[0].startswith("Celery reported its worker process lost: ")
    assert (
        "signal 9 (SIGKILL)" in why.reasons[0] and "the reaper dispatches it again at its lease's end" in why.reasons[0]
    )
    assert KeyedTask.objects.get(task_id=task_id).status == "running", "the run keeps its key until its lease ends"


def test_a_task_dispatched_again_by_a_recovery_leads_with_what_happened(gate_redis, broker):
    [task_id] = submit("account:11", 1)
    KeyedTask.objects.filter(task_id=task_id).update(
        attempts=1, error="its worker was lost: the lease of attempt 1 expired; dispatched again"
    )
    why = explain(task_id)
    assert why.reasons[0].startswith("its worker was lost: the lease of attempt 1 expired; dispatched again (")


# kombu 5.4's broadcast, with redis-py 5, calls get_connection() with an argument redis-py deprecates.
@pytest.mark.filterwarnings("ignore:Call to 'get_connection' function with deprecated usage:DeprecationWarning")
def test_a_granted_task_no_running_worker_consumes_says_so(gate_redis, broker):
    from django.core.cache import cache

    from django_keyed_queue.ops.console import workers

    cache.delete(workers.CACHE_KEY)
    [task_id] = submit("account:12", 1)
    assert not any("inspect" in r for r in explain(task_id).reasons), "just dispatched: nothing asked"
    KeyedTask.objects.filter(task_id=task_id).update(dispatched_at=timezone.now() - timedelta(seconds=30))

    why = explain(task_id)
    assert why.reasons[0].startswith("no worker answered Celery's inspect within 1 s"), why.reasons
    assert f"its queue {QUEUE!r}" in why.reasons[0]


def test_a_rate_is_said_as_an_operator_types_the_one_the_gate_keeps():
    from django_keyed_queue.ops.display import rate_said
    from django_keyed_queue.rates import rate_interval_ms

    said = {rate: rate_said(rate_interval_ms(rate)) for rate in ("3/s", "5/s", "1/m", "59/m", "2/h", "7/h", "700/s")}
    assert said == {"3/s": "3/s", "5/s": "5/s", "1/m": "1/m", "59/m": "59/m", "2/h": "2/h", "7/h": "7/h",
                    "700/s": "500/s"}, "700/s is kept as 2 ms apart: 500 a second"  # fmt: skip
    assert rate_said(12_345) == "one start every 12345 ms"


def test_a_run_whose_start_is_not_recorded_yet_is_told_running_with_no_time_made_up(gate_redis, broker):
    [task_id] = submit("account:12", 1)
    assert get_gate().start(Start("account:12", 1, 1, task_id=task_id)).ok  # its worker has not written its start yet

    [reason] = explain(task_id).reasons
    assert reason == "it holds its key: running", "no 'for None'"
    assert status("--task", task_id).splitlines()[-1].endswith("it holds its key: running")
