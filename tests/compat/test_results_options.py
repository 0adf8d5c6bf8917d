"""Results and states, and the options of ``apply_async``, on plain tasks and their keyed twins."""

from __future__ import annotations

import socket
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from celery.exceptions import TaskRevokedError
from celery.result import AsyncResult

from testproject.celery import app
from testproject.compat import journal
from testproject.compat.tasks import add, fail, quiet, request_fields, spawn
from tests.compat.cases import (
    EVENTS_QUEUE,
    KEYED,
    MARKS,
    check_key,
    events,
    hold_key,
    journal_has,
    keyed_only,
    kinds,
    record,
    starts,
    wait_for_record,
    worker_log,
)
from tests.waiting import wait_until

pytestmark = MARKS


@kinds(wait=False)  # the second and third tasks wait for the key
def test_get_state_and_successful(kind, key, workers):
    results = [add(kind).delay(n, n, key=key, pause=0.1) for n in range(3)]
    assert [r.get(timeout=10) for r in results] == [0, 2, 4]
    assert [(r.state, r.successful(), r.ready(), r.failed()) for r in results] == [("SUCCESS", True, True, False)] * 3
    check_key(kind, key, order=[r.id for r in results])


@kinds()
def test_a_task_submitted_by_a_task_is_among_its_children(kind, key, workers):
    """The keyed child, submitted while its parent holds their key, waits for it: it is a child all the same."""
    hold_key(kind, key)
    parent = spawn(kind).delay(key=key)
    child_id = parent.get(timeout=10)
    assert [child.id for child in parent.children] == [child_id]
    assert AsyncResult(child_id).get(timeout=10) == 3
    check_key(kind, key, order=[parent.id, child_id])


@kinds()
def test_a_failure_keeps_its_exception_and_traceback(kind, key, workers):
    hold_key(kind, key)
    failed = fail(kind).delay("broken on purpose", key=key)
    after = add(kind).delay(1, 1, key=key)
    with pytest.raises(ValueError, match="broken on purpose"):
        failed.get(timeout=10)
    assert (failed.state, failed.failed(), failed.successful()) == ("FAILURE", True, False)
    assert isinstance(failed.result, ValueError) and failed.result.args == ("broken on purpose",)
    assert "ValueError: broken on purpose" in failed.traceback
    assert isinstance(failed.get(propagate=False), ValueError)
    assert after.get(timeout=10) == 2, "the next task (of its key) runs"
    check_key(kind, key, order=[failed.id, after.id])


@kinds()
def test_ignore_result_stores_nothing(kind, key, workers):
    hold_key(kind, key)
    result = quiet(kind).delay(7, key=key)
    wait_until(lambda: journal_has("signal:task_postrun", result.id), 10, message="the task to run")
    assert result.state == "PENDING"
    assert result.backend.get(result.backend.get_key_for_task(result.id)) is None, "no result stored"


@kinds()
def test_get_of_an_ignored_result_returns_none_at_once(kind, key, workers):
    hold_key(kind, key)
    result = quiet(kind).delay(1, key=key)
    assert result.ignored
    assert result.get(timeout=1) is None  # Celery's documented shortcut: None, without waiting


@kinds()
def test_countdown_runs_it_no_sooner(kind, key, workers):
    hold_key(kind, key, seconds=1.5)  # still busy when the delayed task is due
    sent = time.time()
    delayed = add(kind).apply_async((1, 2), {"key": key}, countdown=1)
    assert delayed.get(timeout=10) == 3
    began = {e["id"]: e["t"] for e in events(key, "start")}
    assert began[delayed.id] >= sent + 0.95, "not before its countdown"
    check_key(kind, key)


@kinds(wait=False)
def test_a_delayed_task_does_not_hold_back_the_ones_sent_after_it(kind, key, workers):
    delayed = add(kind).apply_async((1, 2), {"key": key}, countdown=1)
    ready = add(kind).delay(2, 2, key=key)
    assert ready.get(timeout=10) == 4 and delayed.get(timeout=10) == 3
    check_key(kind, key, order=[ready.id, delayed.id])  # a delayed keyed task joins its key's queue when due


@kinds()
def test_eta_runs_it_no_sooner(kind, key, workers):
    hold_key(kind, key, seconds=1.5)
    eta = datetime.now(UTC) + timedelta(seconds=1)
    delayed = add(kind).apply_async((1, 2), {"key": key}, eta=eta)
    assert delayed.get(timeout=10) == 3
    began = {e["id"]: e["t"] for e in events(key, "start")}
    assert began[delayed.id] >= eta.timestamp() - 0.05, "not before its eta"


@kinds(wait=False)
def test_a_task_past_its_expiry_is_revoked_and_never_runs(kind, key, workers):
    expired = add(kind).apply_async((1, 2), {"key": key}, countdown=1, expires=0.5)
    with pytest.raises(TaskRevokedError):
        expired.get(timeout=10)
    assert expired.state == "REVOKED"
    assert add(kind).delay(2, 2, key=key).get(timeout=10) == 4, "the next task (of its key) runs"
    assert expired.id not in starts(key)


@keyed_only(free=False)
def test_a_task_that_expires_while_waiting_for_its_key_is_revoked(kind, key, workers):
    first = hold_key(kind, key, seconds=1.0)
    expiring = add(kind).apply_async((1, 2), {"key": key}, expires=0.3)
    last = add(kind).delay(2, 2, key=key)
    with pytest.raises(TaskRevokedError):
        expiring.get(timeout=10)
    assert expiring.state == "REVOKED"
    assert last.get(timeout=10) == 4 and first.get(timeout=10) == 1.0
    check_key(kind, key, order=[first.id, last.id])
    assert expiring.id not in starts(key)
    assert record(expiring.id).status == "cancelled"


@kinds(wait=False)  # tasks of four keys
def test_priority_orders_the_waiting_messages(kind, key, events_worker):
    """On Redis, priority 0 is the highest: of the messages waiting in a queue, it is taken first."""
    queue = f"compat-priority-{uuid.uuid4().hex[:6]}"
    destination = [f"compat-events@{socket.gethostname()}"]
    low = [add(kind).apply_async((n, 0), {"key": f"{key}-{n}"}, queue=queue, priority=9) for n in range(3)]
    high = add(kind).apply_async((9, 0), {"key": f"{key}-high"}, queue=queue, priority=0)
    assert app.control.add_consumer(queue, destination=destination, reply=True, timeout=5)
    try:
        assert [r.get(timeout=10) for r in [*low, high]] == [0, 1, 2, 9]
    finally:
        app.control.cancel_consumer(queue, destination=destination, reply=True, timeout=5)
    first = next(e for e in journal.read() if e["event"] == "start" and e["key"].startswith(key))
    assert first["id"] == high.id, "the priority 0 task is taken first"


@kinds()
def test_custom_headers_reach_self_request(kind, key, workers):
    hold_key(kind, key)
    result = request_fields(kind).apply_async(kwargs={"names": ["x_tenant"], "key": key}, headers={"x_tenant": "acme"})
    assert result.get(timeout=10) == {"x_tenant": "acme"}


@kinds()
def test_a_given_task_id_is_the_task_s_id(kind, key, workers):
    hold_key(kind, key)
    task_id = f"{key}-given"
    result = add(kind).apply_async((2, 3), {"key": key}, task_id=task_id)
    assert result.id == task_id
    assert AsyncResult(task_id, app=app).get(timeout=10) == 5
    assert task_id in starts(key), "the body ran with that id as self.request.id"


@kinds()
def test_shadow_names_the_task_in_the_worker_log(kind, key, workers):
    hold_key(kind, key)
    shadow = f"compat.shadow.{key}"
    result = add(kind).apply_async((1, 2), {"key": key}, shadow=shadow)
    assert result.get(timeout=10) == 3
    line = f"Task {shadow}[{result.id}] succeeded"
    log = wait_until(lambda: line in (text := worker_log(workers)) and text, 10, message="the success line")
    assert f"{add(kind).name}[{result.id}]" not in log, "the real name is not logged"


@kinds()
def test_argsrepr_and_kwargsrepr_stand_for_the_arguments_in_the_task_received_event(kind, key, task_events):
    hold_key(kind, key, queue=EVENTS_QUEUE)
    result = add(kind).apply_async(
        (40, 2), {"key": key}, argsrepr="(<hidden>,)", kwargsrepr="{'key': '***'}", queue=EVENTS_QUEUE
    )
    assert result.get(timeout=10) == 42
    received = wait_until(
        lambda: next((e for e in task_events if (e["type"], e.get("uuid")) == ("task-received", result.id)), None),
        10,
        message="the task-received event",
    )
    assert (received["args"], received["kwargs"]) == ("(<hidden>,)", "{'key': '***'}")


@keyed_only()
def test_argsrepr_and_kwargsrepr_stand_for_the_arguments_on_the_record(kind, key, workers):
    hold_key(kind, key)
    result = add(KEYED).apply_async((40, 2), {"key": key}, argsrepr="(<hidden>,)", kwargsrepr="{'key': '***'}")
    assert result.get(timeout=10) == 42
    arguments = wait_for_record(result.id, "succeeded").arguments
    assert "40" not in arguments and key not in arguments, arguments
    assert "<hidden>" in arguments and "***" in arguments, arguments


@keyed_only(free=False)
def test_a_task_that_waited_for_its_key_runs_in_the_process_that_freed_it(kind, key, workers):
    """The ``keyed-waited`` cases of this tier exercise the local handoff: the run that frees the key
    runs the next task of its key itself, with no broker message (README, "local handoff")."""
    holder = hold_key(kind, key)
    result = add(kind).delay(1, 2, key=key)
    assert result.get(timeout=10) == 3
    pids = {e["id"]: e["pid"] for e in events(key, "start")}
    assert pids[result.id] == pids[holder.id]
    received = f"Task {add(kind).name}[{result.id}] received"
    assert f"/MainProcess] {received}" not in worker_log(workers), "no broker message"
    assert "/ForkPoolWorker-" in worker_log(workers).split(received)[0].rsplit("\n", 1)[-1], "its child process"
