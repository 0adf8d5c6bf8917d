"""keyed_queue_rebuild: the gate restored from the records after a total loss of Redis."""

import io
import json

import pytest
from django.core.management import call_command

from django_keyed_queue.gate.keys import KeyNames
from django_keyed_queue.messaging.message import HEADER
from django_keyed_queue.process.state import get_gate
from django_keyed_queue.records.models import KeyedTask
from django_keyed_queue.testing import write_submission_rows
from testproject.demo.tasks import step
from tests.django.queues import QUEUE

pytestmark = pytest.mark.django_db


def run(*args) -> str:
    out = io.StringIO()
    call_command("keyed_queue_rebuild", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def test_unfinished_tasks_come_back_in_ticket_order(gate_redis, broker):
    done = step.apply_async(("k", 0), queue=QUEUE)
    write_submission_rows()
    KeyedTask.objects.filter(task_id=done.id).update(status="succeeded")
    gate = get_gate()
    gate.start("k", 1, 1)
    gate.finish("k", 1, gate.inspect("k").holders[1].token)
    running = step.apply_async(("k", 1), queue=QUEUE)
    write_submission_rows()
    KeyedTask.objects.filter(task_id=running.id).update(status="running", attempts=1)
    parked = [step.apply_async(("k", n), queue=QUEUE) for n in (2, 3)]
    other = step.apply_async(("j", 0), queue=QUEUE)
    write_submission_rows()  # as the workers do within KEYED_QUEUE_RECORD_FLUSH_SECONDS
    last_token = gate.inspect("k").last_token
    broker.delete(QUEUE)
    gate_redis.flushdb()  # Redis lost everything

    assert "would restore 3 tasks of key='k'" in run("--dry-run")
    assert gate_redis.dbsize() == 0
    out = run()
    assert "restored 3 tasks of key='k'" in out and "restored 1 task of key='j'" in out

    state = gate.inspect("k")
    assert list(state.holders) == [2] and state.waiting == [3, 4], "tickets kept, oldest granted"
    assert state.last_ticket == 4 and state.last_token > last_token
    headers = [json.loads(raw)["headers"] for raw in broker.lrange(QUEUE, 0, -1)]
    assert {(h["id"], h[HEADER]["ticket"]) for h in headers} == {(running.id, 2), (other.id, 1)}
    assert KeyedTask.objects.get(task_id=parked[0].id).status == "waiting"
    assert KeyedTask.objects.get(task_id=running.id).status == "dispatched"
    assert KeyedTask.objects.get(task_id=done.id).status == "succeeded"
    # The restored key goes on numbering after its last ticket.
    after = step.apply_async(("k", 4), queue=QUEUE)
    write_submission_rows()
    assert KeyedTask.objects.get(task_id=after.id).ticket == 5


def test_a_live_key_is_left_alone(gate_redis, broker):
    step.apply_async(("k", 0), queue=QUEUE)
    before = gate_redis.hgetall(KeyNames("k").holders)
    assert "skipped key='k'" in run()
    assert gate_redis.hgetall(KeyNames("k").holders) == before


def test_a_dry_run_says_what_the_real_run_does_and_writes_nothing(gate_redis, broker):
    lost = step.apply_async(("lost", 1), queue=QUEUE)
    live = [step.apply_async(("slow:1", n), queue=QUEUE) for n in (1, 2)]
    write_submission_rows()
    gate_redis.delete(*gate_redis.scan_iter(f"{KeyNames('lost').base}*"))  # only this key's state was lost
    kept = step.apply_async(("slow:1", 3), queue=QUEUE)  # its row is not written yet: Redis keeps it

    dry = run("--dry-run")
    assert "would restore 1 task of key='lost'" in dry and "skipped key='slow:1': it is live in Redis" in dry
    assert not KeyedTask.objects.filter(task_id=kept.id).exists(), "a dry run writes no record"
    assert not gate_redis.exists(KeyNames("lost").meta), "nor any gate state"

    real = run()
    assert "restored 1 task of key='lost'" in real and "skipped key='slow:1': it is live in Redis" in real
    assert dry.replace("would restore", "restored").replace("dry run: ", "") == real
    assert KeyedTask.objects.filter(task_id=kept.id).exists(), "the real run writes what Redis kept first"
    assert get_gate().inspect("lost").holders, "and restores the lost key"
    assert {t.id for t in live} <= set(KeyedTask.objects.filter(key="slow:1").values_list("task_id", flat=True))
    assert lost.id in KeyedTask.objects.filter(key="lost").values_list("task_id", flat=True)
