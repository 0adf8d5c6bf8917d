"""Idempotency keys of coalescing tasks resolve to the task that runs: the end of the chain of replacements,
whatever the order of the hand-overs, whether the producer lived to make its own, and whether the rows are
written yet."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from unittest import mock

import pytest
from django.conf import settings as django_settings
from django.db import connections
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_keyed_queue.gate import Gate
from django_keyed_queue.gate.clients import connect
from django_keyed_queue.gate.keys import KeyNames
from django_keyed_queue.messaging import superseded
from django_keyed_queue.process.state import get_gate
from django_keyed_queue.records import idempotency
from django_keyed_queue.records.models import IdempotencyKey, KeyedTask
from django_keyed_queue.testing import write_submission_rows
from testproject.demo.tasks import debounced_step, latest_step
from testproject.servers import ROOT
from tests.django.queues import QUEUE
from tests.gate_redis import ON_CLUSTER


def produce(rounds: list[dict]) -> list[list[dict]]:
    """Run ``rounds`` of producers (see ``_coalescing_producers``), each a process of its own; what each
    round's producers reported."""
    gate = {"KEYED_QUEUE_REDIS_URL": django_settings.KEYED_QUEUE_REDIS_URL, "KEYED_QUEUE_REDIS_CLUSTER": ON_CLUSTER}
    plan = json.dumps({"settings": gate, "rounds": rounds})
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    ran = subprocess.run(
        [sys.executable, "-m", "tests.django._coalescing_producers"],
        input=plan, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    return json.loads(ran.stdout)["rounds"]


@contextmanager
def writing_rows(every: float = 0.05) -> Iterator[None]:
    """The records' writer running beside the test, as a worker's does (``RecordWriter``), more often."""
    stop, errors = threading.Event(), []

    def run() -> None:
        try:
            while not stop.wait(every):
                write_submission_rows()
        except Exception as exc:
            errors.append(exc)
        finally:
            connections.close_all()  # this thread's own

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(30)
    assert not errors, errors


def the_one_that_waits(key: str) -> str:
    return KeyedTask.objects.get(key=key, status="waiting").task_id


@pytest.mark.django_db(transaction=True)
def test_producers_racing_coalescing_submissions_resolve_every_key_to_the_task_that_runs(gate_redis, broker):
    """4 processes submit 25 coalescing calls each on 2 keys, each call with its own idempotency key, while
    the records' writer runs. With the writer stopped, 20 more, each from a producer killed before its
    hand-over. Then 4 processes submit the first 100 again, as clients retrying: each returns its key's
    last task, through the rows and then the records the gate keeps."""
    keys = ["edit:a", "edit:b"]
    holders = [latest_step.apply_async((key, 0), queue=QUEUE).id for key in keys]  # the rest wait behind them
    first = [[[keys[n % 2], n, f"edit-{n}", None] for n in range(p + 1, 101, 4)] for p in range(4)]
    later = [[[keys[n % 2], n, f"edit-{n}", f"later-{n}"]] for n in range(101, 121)]

    with writing_rows():
        [raced] = produce([{"producers": first}])
    write_submission_rows()
    killed, retried = produce(
        [{"producers": later, "one_at_a_time": True, "killed_at_hand_over": True}, {"producers": first}]
    )

    assert [p["exit"] for p in killed] == [-9] * 20
    submitted = [i for p in raced for i in p["ids"]]
    resolved = dict(zip(submitted, [i for p in retried for i in p["ids"]], strict=True))
    assert len(set(submitted)) == 100
    write_submission_rows()
    ends = {key: the_one_that_waits(key) for key in keys}
    assert ends == {"edit:a": "later-120", "edit:b": "later-119"}
    superseded_ids = set(KeyedTask.objects.filter(status="superseded").values_list("task_id", flat=True))
    wrong = {s: r for s, r in resolved.items() if r in superseded_ids}
    assert not wrong, f"{len(wrong)} of {len(resolved)} retries returned a superseded task"
    by_key = dict(KeyedTask.objects.filter(task_id__in=submitted).values_list("task_id", "key"))
    assert all(r == ends[by_key[s]] for s, r in resolved.items()), "each resolves to its key's waiting task"
    assert KeyedTask.objects.count() == 122 and broker.llen(QUEUE) == 2, "the retries submitted nothing"
    assert [int(gate_redis.hget(KeyNames(key).meta, "seq")) for key in keys] == [61, 61]
    not_superseded = KeyedTask.objects.exclude(status="superseded").values_list("task_id", flat=True)
    assert set(not_superseded) == set(holders) | set(ends.values())


@pytest.mark.django_db(transaction=True)
def test_producers_killed_before_their_hand_over_leave_it_to_the_writer(gate_redis, broker):
    """10 producers, one after the other, each SIGKILLed right after the gate's call that replaced the task
    waiting, before its own hand-over. The writer writes the first five's rows before the last five come:
    the chain is in the rows, then in the gate's records, when the keys resolve; then in the rows alone."""
    latest_step.apply_async(("edit", 0), queue=QUEUE)
    items = [["edit", n, f"edit-{n}", f"task-{n}"] for n in range(1, 11)]
    killed = {"one_at_a_time": True, "killed_at_hand_over": True}

    [before] = produce([{"producers": [[item] for item in items[:5]], **killed}])
    write_submission_rows()
    [after] = produce([{"producers": [[item] for item in items[5:]], **killed}])

    assert [p["exit"] for p in before + after] == [0] + [-9] * 9, "the first waits without replacing; the rest die"
    pointers = sorted(IdempotencyKey.objects.values_list("task_id", flat=True), key=lambda t: int(t[5:]))
    assert pointers == ["task-5"] * 5 + [f"task-{n}" for n in range(6, 11)], "no producer handed a key over"
    gate = get_gate()
    assert {idempotency.resolve(gate, f"task-{n}", "edit") for n in range(1, 11)} == {"task-10"}, (
        "through the rows, then the records the gate keeps"
    )
    write_submission_rows()
    assert the_one_that_waits("edit") == "task-10"
    again = [latest_step.apply_async(("edit", n), queue=QUEUE, idempotency_key=k).id for _, n, k, _ in items]
    stale = sum(1 for i in again if i != "task-10")
    assert not stale, f"{stale} of {len(items)} retries returned a superseded task"
    assert KeyedTask.objects.count() == 11 and int(gate_redis.hget(KeyNames("edit").meta, "seq")) == 11
    assert IdempotencyKey.objects.count() == 10


_keys = itertools.count()


@pytest.mark.django_db
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_order_of_hand_overs_and_writes_resolves_every_key_to_the_task_that_runs(gate_redis, broker, data):
    """A chain of coalescing submissions, each with its idempotency key (a debounced task's replaces a grant
    not started; another's a parked task); the writer writing between them at random; the producers'
    hand-overs made afterwards in any order, some never: every duplicate returns the last, and takes no ticket."""
    task = data.draw(st.sampled_from([latest_step, debounced_step]), label="task")
    n = data.draw(st.integers(2, 7), label="submissions")
    written_after = data.draw(st.sets(st.integers(0, n - 1)), label="writer passes after submissions")
    key = f"edit:{next(_keys)}"
    if task is latest_step:
        task.apply_async((key, 0), queue=QUEUE)  # holds the key: the others wait
    hand_overs: list[tuple[str, str]] = []
    with mock.patch.object(superseded, "replaced", lambda _task, _key, replaced, by: hand_overs.append((replaced, by))):
        ids = []
        for i in range(n):
            ids.append(task.apply_async((key, i + 1), queue=QUEUE, idempotency_key=f"{key}/{i}").id)
            if i in written_after:
                write_submission_rows()
    assert hand_overs == list(itertools.pairwise(ids)), "each replaced the one before"
    writes = data.draw(st.integers(0, 2), label="writer passes among the hand-overs")
    made = data.draw(st.lists(st.booleans(), min_size=n - 1, max_size=n - 1), label="hand-overs made")
    steps = [*(h for h, m in zip(hand_overs, made, strict=True) if m), *["write"] * writes]
    for step in data.draw(st.permutations(steps), label="order"):
        if step == "write":
            write_submission_rows()
        else:
            idempotency.repoint(*step)
    seq = gate_redis.hget(KeyNames(key).meta, "seq")
    retried_with = data.draw(st.sampled_from(["apply_async", "apply_async_on_commit", "apply_async_many"]))

    if retried_with == "apply_async_many":
        calls, idempotency_keys = [(key, i + 1) for i in range(n)], [f"{key}/{i}" for i in range(n)]
        again = [r.id for r in task.apply_async_many(calls, idempotency_keys=idempotency_keys, queue=QUEUE)]
    else:
        submit = getattr(task, retried_with)
        again = [submit((key, i + 1), queue=QUEUE, idempotency_key=f"{key}/{i}").id for i in range(n)]

    assert again == [ids[-1]] * n
    assert gate_redis.hget(KeyNames(key).meta, "seq") == seq, "no duplicate took a ticket"


@pytest.mark.django_db
def test_a_cycle_in_the_rows_ends_the_lookup(gate_redis, monkeypatch, caplog):
    """No history makes one (a task is replaced only by a later submission), but a lookup must end anyway."""
    monkeypatch.setattr(idempotency, "MAX_REPLACEMENTS", 50)
    for task_id, by in (("a", "b"), ("b", "c"), ("c", "a")):
        KeyedTask.objects.create(
            task_id=task_id, task_name=latest_step.name, key="k", ticket=ord(task_id), status="superseded",
            superseded_by=by, enqueued_at=timezone.now(),
        )  # fmt: skip

    assert idempotency.resolve(get_gate(), "a", "k") in {"a", "b", "c"}
    assert "ends a chain of 50 replacements, the most followed" in caplog.text


@pytest.mark.django_db
def test_with_the_gate_unreachable_a_duplicate_resolves_as_the_rows_say(gate_redis, broker, caplog):
    latest_step.apply_async(("edit", 0), queue=QUEUE)
    first = latest_step.apply_async(("edit", 1), queue=QUEUE, idempotency_key="edit-1")
    second = latest_step.apply_async(("edit", 2), queue=QUEUE)
    write_submission_rows()
    latest_step.apply_async(("edit", 3), queue=QUEUE)  # its replacement of the second is in the gate only
    gate = Gate(connect("redis://127.0.0.1:1/0", cluster=False), lease_seconds=30, dispatch_timeout_seconds=60,
                idle_horizon_seconds=3600)  # fmt: skip

    assert idempotency.resolve(gate, first.id, "edit") == second.id
    assert "records of replacements are unreadable" in caplog.text
