"""``self.replace()``, stamping and revocation on plain tasks and their keyed twins."""

from __future__ import annotations

import socket
import uuid

import pytest
from celery import chain, group
from celery.canvas import StampingVisitor
from celery.exceptions import TaskRevokedError

from testproject.celery import app
from testproject.compat.tasks import add, replaced, request_fields, sleeper
from tests.compat.cases import (
    MARKS,
    PLAIN,
    WAITED,
    check_key,
    events,
    hold_key,
    journal_has,
    kinds,
    starts,
    wait_for_record,
    worker_log,
)
from tests.waiting import wait_until

pytestmark = MARKS


@kinds()
def test_replace_runs_the_replacement_under_the_same_id(kind, key, workers):
    hold_key(kind, key)
    result = replaced(kind).delay(5, key=key)
    assert result.get(timeout=10) == 6
    assert result.state == "SUCCESS"
    assert starts(key)[-1] == result.id, "the replacement ran with the replaced task's id"
    check_key(kind, key)


@kinds()
def test_a_replacement_may_replace_itself_again(kind, key, workers):
    hold_key(kind, key)
    result = replaced(kind).delay(5, key=key, depth=3)
    assert result.get(timeout=10) == 6
    assert starts(key)[-4:] == [result.id] * 4, "three replacements, then add, all under one id"
    check_key(kind, key)


@kinds()
def test_a_delayed_task_replaced_by_delayed_ones_runs_them_all(kind, key, workers):
    """Each replacement is a new submission with the same task id, sent with a countdown of its own."""
    hold_key(kind, key)
    result = replaced(kind).apply_async((5,), {"key": key, "depth": 2, "countdown": 0.2}, countdown=0.2)
    assert result.get(timeout=10) == 6
    assert starts(key)[-3:] == [result.id] * 3, "a replacement, then add, all under one id"
    check_key(kind, key)


@kinds()
def test_a_task_replaced_in_a_chain_passes_the_replacement_s_result_on(kind, key, workers):
    hold_key(kind, key)
    result = chain(replaced(kind).s(5, key=key), add(kind).s(10, key=key))()
    assert result.get(timeout=10) == 16
    check_key(kind, key)


class MonitoringIdStampingVisitor(StampingVisitor):
    """Celery's documented example: stamp every signature of a canvas with one monitoring id."""

    def __init__(self, monitoring_id: str) -> None:
        self.monitoring_id = monitoring_id

    def on_signature(self, sig, **headers) -> dict:
        return {"monitoring_id": self.monitoring_id}


@kinds()
def test_a_stamping_visitor_s_stamps_reach_each_task(kind, key, workers):
    hold_key(kind, key)
    monitoring_id = uuid.uuid4().hex
    names = ["stamped_headers", "stamps"]
    canvas = group(request_fields(kind).s(names, key=key) for _ in range(2))
    canvas.stamp(visitor=MonitoringIdStampingVisitor(monitoring_id))
    seen = canvas.apply_async().get(timeout=10)
    assert seen == [{"stamped_headers": ["monitoring_id"], "stamps": {"monitoring_id": monitoring_id}}] * 2
    check_key(kind, key)


def waiting(kind: str, key: str) -> dict:
    """Make the next task wait before it runs: for its countdown, or (keyed-waited) for its busy key."""
    if kind == WAITED:
        hold_key(kind, key, seconds=1.0)
        return {}
    return {"countdown": 1}


@kinds()
def test_revoke_by_stamped_headers_revokes_a_waiting_task(kind, key, workers):
    monitoring_id = uuid.uuid4().hex
    options = waiting(kind, key)
    signature = add(kind).s(1, 2, key=key).set(**options)
    signature.stamp(visitor=MonitoringIdStampingVisitor(monitoring_id))
    result = signature.apply_async()
    names = [f"{worker.name}@{socket.gethostname()}" for worker in workers]
    replies = app.control.revoke_by_stamped_headers(
        {"monitoring_id": monitoring_id}, destination=names, reply=True, limit=len(names), timeout=5
    )
    assert len(replies) == len(names), replies
    with pytest.raises(TaskRevokedError):
        result.get(timeout=10)
    assert result.state == "REVOKED"
    assert add(kind).delay(2, 2, key=key).get(timeout=10) == 4, "the next task (of its key) runs"
    assert result.id not in starts(key)


@kinds()
def test_revoke_of_a_waiting_task_keeps_it_from_running(kind, key, workers):
    options = waiting(kind, key)
    result = add(kind).apply_async((1, 2), {"key": key}, **options)
    result.revoke()
    wait_until(lambda: revoked(result.id) or result.id in starts(key), 10, message="the worker to drop it")
    assert result.id not in starts(key), "it never ran"
    assert result.state == "REVOKED"
    with pytest.raises(TaskRevokedError):
        result.get(timeout=1)
    assert add(kind).delay(2, 2, key=key).get(timeout=10) == 4, "the next task (of its key) runs"
    if kind != PLAIN:
        assert wait_for_record(result.id, "cancelled")


@kinds()
def test_revoke_with_terminate_kills_a_running_task(kind, key, workers):
    """Also a task run by local handoff, in the job of the task that freed its key, whose result stands."""
    holder = hold_key(kind, key)
    running = sleeper(kind).delay(6, key=key)
    after = add(kind).delay(2, 2, key=key)
    wait_until(lambda: running.id in starts(key), 10, message="the task to run")
    running.revoke(terminate=True)
    killed = wait_until(lambda: revoked(running.id), 5, message="the worker to kill it (task_revoked)")
    assert killed["terminated"] is True
    assert running.state == "REVOKED"
    with pytest.raises(TaskRevokedError):
        running.get(timeout=1)
    # A keyed task's key moves on once the killed run's process had 2 s to die and the reaper (5 s) looked.
    assert after.get(timeout=20) == 4, "the next task (of its key) runs"
    began, ended = (next(e["t"] for e in events(key, name) if e["id"] == running.id) for name in ("start", "end"))
    assert ended - began < 5, "cut short, not slept out"
    if holder is not None:
        assert f"Terminating {running.id} (15), run by local handoff" in worker_log(workers)
        assert holder.state == "SUCCESS", "the task that freed the key keeps its result"
    check_key(kind, key)


def revoked(task_id: str) -> dict | None:
    """The ``task_revoked`` signal a worker sent for the task, if any."""
    return journal_has("signal:task_revoked", task_id)
