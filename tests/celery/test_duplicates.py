"""G4: a duplicate message of a ticket that started or finished is dropped, never run."""

import pytest
from celery import Task

from django_keyed_queue.messaging.building import publish_stored
from django_keyed_queue.messaging.message import TaskMessage, ticket_header
from testproject.demo.history import read as read_history
from testproject.demo.tasks import step
from tests.waiting import wait_for_records, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.workers]


def publish_ticket(key: str, ticket: int, dispatch: int, args: tuple, kwargs: dict, options: dict):
    """Publish a message of ``step`` carrying ticket ``ticket`` of ``key``, as the dispatcher would; its result."""
    options = dict(options)
    message = TaskMessage(step.name, options.pop("task_id"), args, kwargs, options)
    publish_stored(step.app, message, ticket_header(key, ticket, dispatch))
    return step.AsyncResult(message.task_id)


def starts_of(key: str) -> list[int]:
    return [e["n"] for e in read_history() if e["event"] == "start" and e["key"] == key]


def test_duplicate_of_a_granted_message_runs_once(workers, gate_redis):
    first = step.delay("dup", 0, 0.5)
    # The same message again (same task id, ticket and dispatch), as a broker redelivery would.
    for _ in range(3):
        publish_ticket("dup", 1, 1, ("dup", 0, 0.5), {}, {"task_id": first.id})
    wait_for_records([first.id])
    follower = step.delay("dup", 1)
    wait_for_records([follower.id])
    # Late duplicates of the finished ticket are dropped too.
    publish_ticket("dup", 1, 1, ("dup", 0, 0.5), {}, {"task_id": first.id})
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


@pytest.mark.parametrize("forged_args", [("forge", 99), ("another-key", 1)], ids=["other-task-id", "other-key"])
def test_a_message_with_a_copied_header_cannot_take_the_ticket(workers, gate_redis, forged_args):
    # The real message waits on a queue no worker reads, its ticket granted and not started.
    real = step.apply_async(("forge", 1), queue="keyed-queue-tests-unconsumed")
    forged = publish_ticket("forge", 1, 1, forged_args, {}, {"task_id": f"forged-{forged_args[0]}", "queue": "celery"})
    wait_until(
        lambda: any(f"{forged.id}] received" in w.log() for w in workers), timeout=20, message="the forged message"
    )
    wait_until(
        lambda: any(f"[{forged.id}] key='forge' ticket=1: FOREIGN_MESSAGE" in w.log() for w in workers),
        timeout=20,
        message="the forged message to be refused",
    )
    assert starts_of("forge") == [] and starts_of("another-key") == []
    # The real one still runs.
    publish_ticket("forge", 1, 1, ("forge", 1), {}, {"task_id": real.id, "queue": "celery"})
    wait_for_records([real.id])
    assert starts_of("forge") == [1]
