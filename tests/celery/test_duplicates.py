"""G4: a duplicate message of a ticket that started or finished is dropped, never run."""

import pytest
from celery import Task

from testproject.demo.tasks import step
from tests.helpers import read_history, wait_for_records, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.workers]


def starts_of(key: str) -> list[int]:
    return [e["n"] for e in read_history() if e["event"] == "start" and e["key"] == key]


def test_duplicate_of_a_granted_message_runs_once(workers, gate_redis):
    first = step.delay("dup", 0, 0.5)
    # The same message again (same task id, ticket and dispatch), as a broker redelivery would.
    for _ in range(3):
        step._publish("dup", 1, 1, ("dup", 0, 0.5), {}, {"task_id": first.id})
    wait_for_records([first.id])
    follower = step.delay("dup", 1)
    wait_for_records([follower.id])
    # Late duplicates of the finished ticket are dropped too.
    step._publish("dup", 1, 1, ("dup", 0, 0.5), {}, {"task_id": first.id})
    last = step.delay("dup", 2)
    wait_for_records([last.id])
    assert starts_of("dup") == [0, 1, 2]


def test_duplicate_of_a_delayed_message_joins_once(workers, gate_redis):
    # A message without a ticket joins its key's queue on arrival; a copy must not join again.
    task_id = "joined-once"
    for _ in range(3):
        Task.apply_async(step, ("late", 0, 0.2), {}, task_id=task_id)
    wait_until(lambda: len(starts_of("late")) >= 1, timeout=20, message="the delayed task to run")
    after = step.delay("late", 1)
    wait_for_records([after.id])
    assert starts_of("late") == [0, 1]
