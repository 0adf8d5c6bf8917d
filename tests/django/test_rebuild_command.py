"""keyed_queue_rebuild: the gate restored from the records after a total loss of Redis."""

import io
import json

import pytest
from django.core.management import call_command

from django_keyed_queue.gate import Finish, Start
from django_keyed_queue.gate.keys import KeyNames
from django_keyed_queue.messaging.message import HEADER
from django_keyed_queue.process.state import get_gate
from django_keyed_queue.records.models import KeyedTask
from django_keyed_queue.testing import write_submission_rows
from testproject.demo.tasks import ledger_entry, step
from tests.django.queues import QUEUE

pytestmark = pytest.mark.django_db


def run(*args) -> str:
    out = io.StringIO()
    call_command("keyed_queue_rebuild", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def lose_redis(gate_redis, broker) -> None:
    broker.delete(QUEUE)
    gate_redis.flushdb()  # Redis lost everything


def test_unfinished_tasks_come_back_in_ticket_order_and_a_run_at_the_loss_is_marked_lost(gate_redis, broker):
    done = step.apply_async(("k", 0), queue=QUEUE)
    write_submission_rows()
    KeyedTask.objects.filter(task_id=done.id).update(status="succeeded")
    gate = get_gate()
    gate.start(Start("k", 1, 1))
    gate.finish(Finish("k", 1, gate.inspect("k").holders[1].token))
    running = step.apply_async(("k", 1), queue=QUEUE)
    write_submission_rows()
    KeyedTask.objects.filter(task_id=running.id).update(status="running", attempts=1)
    parked = [step.apply_async(("k", n), queue=QUEUE) for n in (2, 3)]
    other = step.apply_async(("j", 0), queue=QUEUE)
    write_submission_rows()  # as the workers do within KEYED_QUEUE_RECORD_FLUSH_SECONDS
    last_token = gate.inspect("k").last_token
    lose_redis(gate_redis, broker)

    dry = run("--dry-run")
    assert "would restore 2 tasks of key='k'" in dry and f"would mark task {running.id} of key='k' lost" in dry
    assert gate_redis.dbsize() == 0
    out = run()
    assert dry.replace("would restore", "restored").replace("would mark", "marked").replace("dry run: ", "") == out
    assert "restored 2 tasks of key='k'" in out and "restored 1 task of key='j'" in out

    state = gate.inspect("k")
    assert list(state.holders) == [3] and state.waiting == [4], "tickets kept, oldest granted"
    assert state.last_ticket == 4 and state.last_token > last_token
    headers = [json.loads(raw)["headers"] for raw in broker.lrange(QUEUE, 0, -1)]
    assert {(h["id"], h[HEADER]["ticket"]) for h in headers} == {(parked[0].id, 3), (other.id, 1)}
    lost = KeyedTask.objects.get(task_id=running.id)
    assert lost.status == "failed" and lost.error.startswith("lost with the gate's Redis while it ran (attempt 1)")
    assert KeyedTask.objects.get(task_id=parked[1].id).status == "waiting"
    assert KeyedTask.objects.get(task_id=done.id).status == "succeeded"
    # The restored key goes on numbering after its last ticket.
    after = step.apply_async(("k", 4), queue=QUEUE)
    write_submission_rows()
    assert KeyedTask.objects.get(task_id=after.id).ticket == 5


def test_a_run_at_the_loss_runs_again_first_when_the_operator_asks(gate_redis, broker):
    running, waiting = (step.apply_async(("k", n), queue=QUEUE) for n in (1, 2))
    write_submission_rows()
    KeyedTask.objects.filter(task_id=running.id).update(status="running", attempts=1)
    lose_redis(gate_redis, broker)

    assert "restored 2 tasks of key='k'" in run("--rerun-running")
    assert list(get_gate().inspect("k").holders) == [1] and get_gate().inspect("k").waiting == [2]
    assert KeyedTask.objects.get(task_id=running.id).status == "dispatched"


def test_a_key_that_took_submissions_since_the_loss_runs_its_old_tasks_before_its_waiting_ones(gate_redis, broker):
    old = [step.apply_async(("k", n), queue=QUEUE) for n in (1, 2, 3)]
    write_submission_rows()
    lose_redis(gate_redis, broker)
    new = [step.apply_async(("k", n), queue=QUEUE) for n in (4, 5)]  # after the loss: 4 runs, 5 waits
    write_submission_rows()
    assert [KeyedTask.objects.get(task_id=r.id).ticket for r in new] == [1, 2], "tickets started over"

    dry = run("--dry-run")
    assert "would restore 3 tasks of key='k' after its holders, before the tasks submitted since" in dry
    assert "2 tasks the gate still keeps left as they are" in dry
    out = run()
    assert dry.replace("would restore", "restored").replace("dry run: ", "") == out

    state = get_gate().inspect("k", waiting_shown=10)
    assert list(state.holders) == [1] and state.waiting == [3, 4, 5, 6]
    tickets = {r.id: KeyedTask.objects.get(task_id=r.id).ticket for r in (*old, *new)}
    assert [tickets[r.id] for r in old] == [3, 4, 5] and [tickets[r.id] for r in new] == [1, 6]
    assert {KeyedTask.objects.get(task_id=r.id).status for r in old} == {"waiting"}
    assert "restored 0 tasks over 0 keys" in run(), "a second rebuild finds every task kept"
    assert get_gate().inspect("k", waiting_shown=10).waiting == [3, 4, 5, 6]


def test_a_live_key_that_lost_nothing_is_left_alone(gate_redis, broker):
    step.apply_async(("k", 0), queue=QUEUE)
    before = gate_redis.hgetall(KeyNames("k").holders)
    assert "restored 0 tasks over 0 keys" in run() and "1 tasks the gate still keeps left as they are" in run()
    assert gate_redis.hgetall(KeyNames("k").holders) == before


def test_a_dry_run_says_what_the_real_run_does_and_writes_nothing(gate_redis, broker):
    lost = step.apply_async(("lost", 1), queue=QUEUE)
    live = [step.apply_async(("slow:1", n), queue=QUEUE) for n in (1, 2)]
    write_submission_rows()
    gate_redis.delete(*gate_redis.scan_iter(f"{KeyNames('lost').base}*"))  # only this key's state was lost
    kept = step.apply_async(("slow:1", 3), queue=QUEUE)  # its row is not written yet: Redis keeps it

    dry = run("--dry-run")
    assert "would restore 1 task of key='lost'" in dry and "slow:1" not in dry.split("dry run:")[0]
    assert not KeyedTask.objects.filter(task_id=kept.id).exists(), "a dry run writes no record"
    assert not gate_redis.exists(KeyNames("lost").meta), "nor any gate state"

    real = run()
    assert (
        dry.replace("would restore", "restored")
        .replace("dry run: ", "")
        .replace("2 tasks the gate still keeps", "3 tasks the gate still keeps")
        == real
    ), "the same plan; the real run wrote the record Redis kept first, and counts it kept"
    assert KeyedTask.objects.filter(task_id=kept.id).exists(), "the real run writes what Redis kept first"
    assert get_gate().inspect("lost").holders, "and restores the lost key"
    assert {t.id for t in live} <= set(KeyedTask.objects.filter(key="slow:1").values_list("task_id", flat=True))
    assert lost.id in KeyedTask.objects.filter(key="lost").values_list("task_id", flat=True)


def test_a_dry_run_and_the_real_run_report_a_task_without_its_message_alike(gate_redis, broker):
    keep, bare = (step.apply_async(("k", n), queue=QUEUE) for n in (1, 2))
    write_submission_rows()
    KeyedTask.objects.filter(task_id=bare.id).update(message="")
    lose_redis(gate_redis, broker)
    said = []
    for args in (("--dry-run",), ()):
        err = io.StringIO()
        with pytest.raises(SystemExit) as exited:
            call_command("keyed_queue_rebuild", *args, stdout=io.StringIO(), stderr=err)
        said.append((exited.value.code, err.getvalue()))
    assert said[0] == said[1] == (1, f"cannot restore task {bare.id}: its record has no stored message of its own\n")
    assert list(get_gate().inspect("k").holders) == [1], "the others of its key are restored"


def test_a_run_at_the_loss_that_blocks_its_key_on_failure_holds_the_key_back(gate_redis, broker):
    running, waiting = (ledger_entry.apply_async(("ledger:1", n), queue=QUEUE) for n in (1, 2))
    write_submission_rows()
    KeyedTask.objects.filter(task_id=running.id).update(status="running", attempts=1)
    lose_redis(gate_redis, broker)

    out = run()
    assert f"key='ledger:1' not restored: {ledger_entry.name}[{running.id}] was running when Redis was lost" in out
    assert "--rerun-running" in out and "1 keys held back by one" in out
    assert gate_redis.dbsize() == 0, "nothing of the key runs past it"
    assert {r.status for r in KeyedTask.objects.filter(key="ledger:1")} == {"running", "waiting"}
    assert "restored 2 tasks of key='ledger:1'" in run("--rerun-running")


def test_a_key_that_cannot_be_restored_is_told_and_the_others_are_restored(gate_redis, broker):
    bad, good = step.apply_async(("bad", 1), queue=QUEUE), step.apply_async(("good", 1), queue=QUEUE)
    write_submission_rows()
    lose_redis(gate_redis, broker)
    gate_redis.set(KeyNames("bad").meta, "not a hash")  # someone else's value where the gate keeps a key's

    err = io.StringIO()
    with pytest.raises(SystemExit) as exited:
        call_command("keyed_queue_rebuild", stdout=io.StringIO(), stderr=err)
    assert exited.value.code == 1 and "key='bad' could not be restored" in err.getvalue()
    assert list(get_gate().inspect("good").holders) == [1], "the other key is restored"
    untouched = KeyedTask.objects.get(task_id=bad.id)
    assert (untouched.status, untouched.error) == ("dispatched", "") and gate_redis.get(KeyNames("bad").meta)
    assert KeyedTask.objects.get(task_id=good.id).status == "dispatched"
