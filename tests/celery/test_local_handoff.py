"""Local handoff on real prefork workers: the finishing process runs its key's next task itself."""

import os
import re
import threading
import uuid
from pathlib import Path

import pytest
from celery import current_app
from celery.states import FAILURE

from django_keyed_queue.messaging.message import TaskMessage
from django_keyed_queue.process.state import get_gate
from django_keyed_queue.records.models import KeyedTask
from testproject.demo.history import read as read_history
from testproject.demo.tasks import failing_step, flaky_step, plain_step, step, timed_step
from testproject.history_checks import assert_serial
from testproject.servers import QUIET_WORKER_ARGS, Worker
from tests.waiting import wait_for_records, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.workers]


def received_by_broker(workers, results) -> set[str]:
    """The task ids a worker's main process received as broker messages (Celery logs each one)."""
    logs = "".join(worker.log() for worker in workers)
    ids = {r.id for r in results}
    # A local handoff logs the same line, from the child process that runs the task.
    received = re.findall(r"/MainProcess\] Task [\w.]+\[([0-9a-f-]{36})\] received", logs)
    return {task_id for task_id in received if task_id in ids}


def pids_of_starts(key: str) -> dict[int, int]:
    return {e["n"]: e["pid"] for e in read_history() if e["event"] == "start" and e["key"] == key}


def test_parked_tasks_run_in_the_process_that_frees_the_key(workers, gate_redis):
    first = step.delay("lh", 0, 0.5)
    parked = [step.delay("lh", n) for n in range(1, 21)]
    records = wait_for_records([first.id, *(r.id for r in parked)])
    assert assert_serial(read_history())["lh"] == list(range(21))
    pids = pids_of_starts("lh")
    assert {pids[n] for n in range(1, 21)} == {pids[0]}, "the parked tasks should run where the first ran"
    assert received_by_broker(workers, [first, *parked]) == {first.id}
    # Celery's tracer ran them: results in the result backend, and the records complete.
    assert [r.get(timeout=10) for r in parked] == list(range(1, 21))
    for r in parked:
        record = records[r.id]
        assert record.status == "succeeded" and record.attempts == 1
        assert record.dispatched_at and record.started_at and record.finished_at and record.worker


def test_a_task_with_a_time_limit_goes_through_the_broker(workers, gate_redis):
    results = [timed_step.delay("tl", 0, 0.3), *(timed_step.delay("tl", n) for n in range(1, 6))]
    wait_for_records(r.id for r in results)
    assert assert_serial(read_history())["tl"] == list(range(6))
    assert received_by_broker(workers, results) == {r.id for r in results}


@pytest.fixture
def own_worker(redis_server, django_db_setup):
    """Starts a worker with extra command-line arguments, alone on a queue of its own."""
    started = []

    def start(*args: str) -> tuple[Worker, str]:
        queue = f"own-{uuid.uuid4().hex[:6]}"
        worker = Worker(
            queue, Path(os.environ["TESTPROJECT_DATA_DIR"]) / "logs", queues=queue, args=(*QUIET_WORKER_ARGS, *args)
        )
        started.append(worker)
        return worker.start(), queue

    yield start
    for worker in started:
        worker.stop()


def test_a_worker_with_a_time_limit_of_its_own_hands_off_through_the_broker(own_worker, gate_redis):
    worker, queue = own_worker("--soft-time-limit", "30")
    results = [step.apply_async(("wl", 0, 0.3), queue=queue)]
    results += [step.apply_async(("wl", n), queue=queue) for n in range(1, 6)]
    wait_for_records(r.id for r in results)
    assert assert_serial(read_history())["wl"] == list(range(6))
    assert received_by_broker([worker], results) == {r.id for r in results}


def test_a_handed_off_task_sends_the_task_events_of_its_worker(own_worker, gate_redis):
    events: list[dict] = []
    with current_app.connection_for_read() as connection:
        receiver = current_app.events.Receiver(connection, handlers={"*": events.append})
        listener = threading.Thread(target=receiver.capture, kwargs={"limit": None, "wakeup": False})
        listener.start()
        try:
            worker, queue = own_worker("-E")

            def listening():  # an event of our own came back: the receiver's queue is bound
                with current_app.events.default_dispatcher() as dispatcher:
                    dispatcher.send("test-listening")
                return any(e["type"] == "test-listening" for e in events)

            wait_until(listening, timeout=30, interval=0.2, message="the event receiver")
            results = [
                step.apply_async(("ev", 0, 0.5), queue=queue),
                step.apply_async(("ev", 1), queue=queue),
                failing_step.apply_async(("ev", 2), queue=queue),
                flaky_step.apply_async(("ev", 3), {"failures": 1, "countdown": 1.0}, queue=queue),
            ]
            wait_for_records(r.id for r in results)
            ids = [r.id for r in results]

            def task_events():
                found = [[e["type"] for e in events if e.get("uuid") == i] for i in ids]
                return (
                    found if all(types and types[-1] in ("task-succeeded", "task-failed") for types in found) else None
                )

            found = wait_until(task_events, timeout=10, message="the tasks' events")
        finally:
            receiver.should_stop = True
            listener.join(10)
    handed_off = ["task-received", "task-started"]
    assert found[1:3] == [[*handed_off, "task-succeeded"], [*handed_off, "task-failed"]]
    # The retry goes through the broker: the worker's main process sends the events of its run,
    # and may receive its message before the handed-off run's task-retried is sent.
    assert found[3][:2] == handed_off and found[3][-2:] == ["task-started", "task-succeeded"]
    assert sorted(found[3]) == sorted([*handed_off, "task-retried", *handed_off, "task-succeeded"])
    assert received_by_broker([worker], results) == {results[0].id, results[3].id}
    # The failure run by handoff keeps what an operator's retry submits again.
    failed = KeyedTask.objects.get(task_id=results[2].id)
    assert TaskMessage.decode(failed.message.encode(), ["json"]).args == ("ev", 2)


def test_a_long_run_of_handoffs_goes_back_to_the_broker_after_the_budget(workers, gate_redis):
    # 0.15 s each: 15 of them outlast the test workers' 2 s budget, so the key goes through the broker.
    results = [step.delay("budget", 0, 0.3), *(step.delay("budget", n, 0.15) for n in range(1, 16))]
    wait_for_records((r.id for r in results), timeout=60)
    assert assert_serial(read_history())["budget"] == list(range(16))
    by_broker = received_by_broker(workers, results[1:])
    assert by_broker, "the budget should send some of the key's tasks through the broker"
    assert len(by_broker) < 15, "the tasks within the budget should be handed off locally"


def test_failure_and_retry_of_a_handed_off_task(workers, gate_redis):
    first = step.delay("fr", 0, 0.5)
    failed = failing_step.delay("fr", 1)
    flaky = flaky_step.delay("fr", 2, failures=1, countdown=0.3)
    last = step.delay("fr", 3)
    records = wait_for_records([first.id, failed.id, flaky.id, last.id])
    starts = [(e["n"], e.get("attempt")) for e in read_history() if e["event"] == "start"]
    assert starts == [(0, None), (1, None), (2, 0), (2, 1), (3, None)]
    assert records[failed.id].status == "failed" and "fails on purpose" in records[failed.id].error
    assert failed.state == FAILURE
    assert records[flaky.id].status == "succeeded" and records[flaky.id].attempts == 2
    assert flaky.get(timeout=10) == 2 and last.get(timeout=10) == 3
    # The failure was handed off locally; the retry went through the broker with its ticket.
    assert failed.id not in received_by_broker(workers, [failed])
    assert flaky.id in received_by_broker(workers, [flaky])


def test_a_handed_off_task_calls_its_link(workers, gate_redis):
    first = step.delay("ln", 0, 0.5)
    linked = step.apply_async(("ln", 1), link=plain_step.si("ln-callback", 7))
    wait_for_records([first.id, linked.id])
    assert linked.id not in received_by_broker(workers, [linked])
    wait_until(lambda: pids_of_starts("ln-callback"), timeout=10, message="the link to run")


def test_a_kept_grant_its_process_cannot_run_goes_by_broker_with_one_attempt(workers, gate_redis):
    # The finish of task 0 keeps and starts task 1 (same task); its expiry is the worker's to honour,
    # so the process gives the start back and publishes it: it runs once, by broker, as attempt 1.
    first = step.delay("gb", 0, 0.5)
    expiring = [step.apply_async(("gb", n), expires=60) for n in (1, 2)]
    records = wait_for_records([first.id, *(r.id for r in expiring)])
    assert assert_serial(read_history())["gb"] == [0, 1, 2]
    assert received_by_broker(workers, expiring) == {r.id for r in expiring}
    assert [records[r.id].attempts for r in expiring] == [1, 1]
    assert [r.get(timeout=10) for r in expiring] == [1, 2]
    assert not get_gate().inspect("gb").holders
