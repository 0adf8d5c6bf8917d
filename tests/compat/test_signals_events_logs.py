"""Signals, task events (``celery worker -E``), task logging and time limits, on plain tasks and their
keyed twins."""

from __future__ import annotations

import os
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from celery.exceptions import TimeLimitExceeded

from testproject.compat import journal
from testproject.compat.tasks import add, fail, flaky, hard_limited, logs, request_fields, soft_limited
from tests.compat.cases import EVENTS_QUEUE, MARKS, hold_key, journal_has, kinds, worker_log
from tests.waiting import wait_until

pytestmark = MARKS


def signals_of(task_id: str) -> list[dict]:
    """The compat signal receivers' notes of one task, in the order they fired."""
    return [e for e in journal.read() if e["event"].startswith("signal:") and e.get("id") == task_id]


def fired(task_id: str) -> list[str]:
    return [e["event"].removeprefix("signal:") for e in signals_of(task_id)]


def wait_for_signal(name: str, task_id: str, timeout: float = 10) -> dict:
    return wait_until(lambda: journal_has(f"signal:{name}", task_id), timeout, message=f"{name} of {task_id}")


@kinds()
def test_publish_signals_fire_in_the_process_that_sends_the_task(kind, key, workers):
    """Also for a task that waits for its key: Celery built its message and sent it, to the gate, in
    the caller; the process that publishes it when its turn comes fires nothing."""
    hold_key(kind, key)
    result = add(kind).delay(1, 2, key=key)
    assert result.get(timeout=10) == 3
    published = [e for e in signals_of(result.id) if e["event"].endswith("_task_publish")]
    assert [(e["event"], e["pid"]) for e in published] == [
        ("signal:before_task_publish", os.getpid()),
        ("signal:after_task_publish", os.getpid()),
    ]


@kinds()
def test_the_worker_logs_and_signals_the_task_s_receipt(kind, key, workers):
    hold_key(kind, key)
    result = add(kind).delay(1, 2, key=key)
    assert result.get(timeout=10) == 3
    wait_for_signal("task_postrun", result.id)
    assert f"Task {add(kind).name}[{result.id}] received" in worker_log(workers)
    assert fired(result.id).count("task_received") == 1


@kinds()
def test_a_header_added_by_before_task_publish_reaches_the_task(kind, key, workers):
    """Tracing tools add the caller's context this way; a task that waited for its key, and ran by
    local handoff or by a message its turn published, gets the caller's too."""
    hold_key(kind, key)
    result = request_fields(kind).delay(["compat_published_by"], key=key)
    assert result.get(timeout=10)["compat_published_by"] == os.getpid()


@kinds()
def test_prerun_success_and_postrun_fire_around_a_run(kind, key, workers):
    hold_key(kind, key)
    result = add(kind).delay(1, 2, key=key)
    assert result.get(timeout=10) == 3
    wait_for_signal("task_postrun", result.id)
    run = [e for e in signals_of(result.id) if e["event"] in RUN_SIGNALS]
    assert [e["event"] for e in run] == ["signal:task_prerun", "signal:task_success", "signal:task_postrun"]
    assert run[1]["result"] == 3 and run[2]["state"] == "SUCCESS"
    assert len({e["pid"] for e in run}) == 1, "all three in the process that ran the task"


RUN_SIGNALS = {f"signal:{name}" for name in ("task_prerun", "task_success", "task_failure", "task_postrun")}


@kinds()
def test_task_failure_fires_for_a_failed_run(kind, key, workers):
    hold_key(kind, key)
    result = fail(kind).delay("broken on purpose", key=key)
    assert isinstance(result.get(timeout=10, propagate=False), ValueError)
    wait_for_signal("task_postrun", result.id)
    run = [e for e in signals_of(result.id) if e["event"] in RUN_SIGNALS]
    assert [e["event"] for e in run] == ["signal:task_prerun", "signal:task_failure", "signal:task_postrun"]
    assert run[1]["exception"] == "ValueError('broken on purpose')" and run[2]["state"] == "FAILURE"


@kinds()
def test_task_retry_fires_for_each_retry(kind, key, workers):
    hold_key(kind, key)
    result = flaky(kind).delay(2, key=key, countdown=0.1)
    assert result.get(timeout=10) == 2
    wait_until(lambda: fired(result.id).count("task_postrun") == 3, 10, message="three runs")
    assert fired(result.id).count("task_retry") == 2
    assert fired(result.id).count("task_prerun") == 3
    assert fired(result.id).count("task_success") == 1


@kinds()
def test_run_signals_fire_once_for_a_delayed_task(kind, key, workers):
    hold_key(kind, key, seconds=2)  # still busy when the delayed task is due
    result = add(kind).apply_async((1, 2), {"key": key}, countdown=1)
    assert result.get(timeout=10) == 3
    wait_for_signal("task_postrun", result.id)
    assert [name for name in fired(result.id) if f"signal:{name}" in RUN_SIGNALS] == [
        "task_prerun",
        "task_success",
        "task_postrun",
    ]


@kinds()
def test_a_delayed_task_s_message_is_published_once_as_its_caller_built_it(kind, key, workers):
    """Also when its key is busy when due: it waits in the gate and its message, as its caller's
    Celery built it (eta and the caller's header in it), is published when its turn comes."""
    hold_key(kind, key, seconds=2)  # still busy when the delayed task is due
    eta = datetime.now(UTC) + timedelta(seconds=1)
    result = request_fields(kind).apply_async((["compat_published_by", "eta"],), {"key": key}, eta=eta)
    fields = result.get(timeout=10)
    assert fields["compat_published_by"] == os.getpid(), "the caller's header reaches the run"
    assert datetime.fromisoformat(fields["eta"]) == eta, "the run's request shows its eta, as Celery's does"
    published = [e for e in signals_of(result.id) if e["event"].endswith("_task_publish")]
    assert [(e["event"], e["pid"]) for e in published] == [
        ("signal:before_task_publish", os.getpid()),
        ("signal:after_task_publish", os.getpid()),
    ]


def task_events_of(task_events: list[dict], task_id: str) -> list[str]:
    return [e["type"] for e in task_events if e.get("uuid") == task_id and e["type"].startswith("task-")]


@kinds()
def test_a_worker_with_events_sends_received_started_and_succeeded(kind, key, task_events):
    hold_key(kind, key, queue=EVENTS_QUEUE)
    result = add(kind).apply_async((1, 2), {"key": key}, queue=EVENTS_QUEUE)
    assert result.get(timeout=10) == 3
    wait_until(lambda: "task-succeeded" in task_events_of(task_events, result.id), 10, message="task-succeeded")
    assert task_events_of(task_events, result.id) == ["task-received", "task-started", "task-succeeded"]
    received = next(e for e in task_events if (e["type"], e.get("uuid")) == ("task-received", result.id))
    assert received["name"] == add(kind).name and received["hostname"].startswith("compat-events@")


@kinds()
def test_a_worker_with_events_sends_task_failed(kind, key, task_events):
    hold_key(kind, key, queue=EVENTS_QUEUE)
    result = fail(kind).apply_async(("broken on purpose",), {"key": key}, queue=EVENTS_QUEUE)
    assert isinstance(result.get(timeout=10, propagate=False), ValueError)
    wait_until(lambda: "task-failed" in task_events_of(task_events, result.id), 10, message="task-failed")
    assert task_events_of(task_events, result.id) == ["task-received", "task-started", "task-failed"]
    failed = next(e for e in task_events if (e["type"], e.get("uuid")) == ("task-failed", result.id))
    assert failed["exception"] == "ValueError('broken on purpose')"


@kinds()
def test_a_task_logger_s_lines_name_the_task_and_its_id(kind, key, workers):
    hold_key(kind, key)
    marker = uuid.uuid4().hex
    result = logs(kind).delay(marker, key=key)
    assert result.get(timeout=10) == marker
    line = f"{logs(kind).name}[{result.id}]: compat log line {marker}"
    wait_until(lambda: line in worker_log(workers), 10, message=f"the line {line!r}")


@kinds()
def test_soft_time_limit_raises_inside_the_task(kind, key, workers):
    hold_key(kind, key)
    result = soft_limited(kind).delay(key=key)
    assert result.get(timeout=10) == "caught SoftTimeLimitExceeded"


@kinds()
def test_hard_time_limit_kills_the_task_and_fails_it(kind, key, workers):
    hold_key(kind, key)
    result = hard_limited(kind).delay(key=key)
    after = add(kind).delay(1, 1, key=key)
    with pytest.raises(TimeLimitExceeded):
        result.get(timeout=10)
    assert result.state == "FAILURE"
    # A keyed task's key moves on once the killed run's process had 2 s to die and the reaper (5 s) looked.
    assert after.get(timeout=20) == 2, "the next task (of its key) runs"
