"""Recovery from the operator's side: keyed_queue_reap, its dry run, and the records it settles."""

import io
import json

import pytest
from django.core.management import call_command

from django_keyed_queue.gate import Gate, KeyNames
from django_keyed_queue.models import KeyedTask
from django_keyed_queue.task import HEADER
from testproject.demo.tasks import step
from tests.helpers import wait_until

from .conftest import QUEUE

pytestmark = pytest.mark.django_db


def lose_a_running_task(gate_redis, broker, *, max_lost):
    """Submit a task, start it as a worker would with a tiny lease, and let the lease expire."""
    result = step.apply_async(("k", 1), queue=QUEUE)
    broker.delete(QUEUE)  # the worker took the message
    short = Gate(gate_redis, lease_seconds=0.1)
    started = short.start("k", 1, 1, max_lost=max_lost)
    assert started.ok
    wait_until(lambda: short.inspect("k")["holders"][1]["deadline_in"] < 0, timeout=5, message="lease expiry")
    return result


def run(*args) -> str:
    out = io.StringIO()
    call_command("keyed_queue_reap", *args, stdout=out)
    return out.getvalue()


def test_dry_run_reports_and_changes_nothing(gate_redis, broker):
    lose_a_running_task(gate_redis, broker, max_lost=1)
    before = gate_redis.hgetall(KeyNames("k").holders)
    out = run("--dry-run")
    assert "would redispatch key='k' ticket=1" in out
    assert gate_redis.hgetall(KeyNames("k").holders) == before
    assert broker.llen(QUEUE) == 0


def test_a_lost_run_is_dispatched_again_and_recorded(gate_redis, broker):
    result = lose_a_running_task(gate_redis, broker, max_lost=1)
    out = run()
    assert "redispatch key='k' ticket=1" in out and "redispatch 1" in out
    message = json.loads(broker.lindex(QUEUE, 0))
    assert message["headers"]["id"] == result.id
    assert message["headers"][HEADER] == {"key": "k", "ticket": 1, "dispatch": 2}
    row = KeyedTask.objects.get(task_id=result.id)
    assert row.status == "dispatched" and "lease of attempt 1 expired" in row.error


def test_a_run_lost_once_too_often_fails_and_passes_the_key_on(gate_redis, broker):
    result = lose_a_running_task(gate_redis, broker, max_lost=0)
    follower = step.apply_async(("k", 2), queue=QUEUE)
    run()
    assert KeyedTask.objects.get(task_id=result.id).status == "failed"
    assert "no recoveries left" in KeyedTask.objects.get(task_id=result.id).error
    assert json.loads(broker.lindex(QUEUE, 0))["headers"]["id"] == follower.id
    assert KeyedTask.objects.get(task_id=follower.id).status == "waiting"  # dispatched once the flush runs
