"""Workers lost mid-task (SIGKILL), stalled past their lease (SIGSTOP), shut down (SIGTERM),
and messages lost between the gate and the broker: keys move on, nothing is lost or run twice
while its lease is live, order holds."""

import os
import signal
import time

import pytest
import redis
from django.conf import settings

from django_keyed_queue.process.state import get_gate
from django_keyed_queue.testing import write_submission_rows
from testproject.demo.history import read as read_history
from testproject.demo.tasks import lingering_step, returning_step
from testproject.history_checks import assert_serial
from tests.chaos.timings import TIMINGS
from tests.waiting import wait_for_records, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.workers]

#: A lost holder blocks its key for at most the lease plus the reaper period (G3), plus slack
#: for a loaded 2-core machine.
RECOVERY_BOUND = TIMINGS["LEASE_SECONDS"] + 1.2 * TIMINGS["REAP_INTERVAL_SECONDS"] + 3.0


def submit(chaos, key, count, linger):
    first = lingering_step.apply_async((key, 0, linger), queue=chaos.queue)
    return [first, *(lingering_step.apply_async((key, n), queue=chaos.queue) for n in range(1, count))]


def starts(key):
    return [e for e in read_history() if e["event"] == "start" and e["key"] == key]


def first_run_started(key):
    return wait_until(lambda: starts(key), timeout=30, message=f"{key} to start")[0]


def test_sigkill_of_a_child_process_mid_task(chaos):
    chaos.start(2)
    results = submit(chaos, "crash", 6, linger=60)
    victim = first_run_started("crash")
    killed_at = time.time()
    os.kill(victim["pid"], signal.SIGKILL)

    records = wait_for_records(r.id for r in results)
    runs = starts("crash")
    assert [(e["n"], e["attempt"]) for e in runs] == [(0, 1), (0, 2), (1, 1), (2, 1), (3, 1), (4, 1), (5, 1)]
    assert runs[1]["t"] - killed_at < RECOVERY_BOUND
    assert_serial(read_history())
    assert (records[results[0].id].status, records[results[0].id].attempts) == ("succeeded", 2)
    assert {records[r.id].status for r in results} == {"succeeded"}
    assert not get_gate().inspect("crash").holders


def test_sigkill_of_a_whole_worker(chaos):
    chaos.start(2)
    results = submit(chaos, "host-down", 5, linger=60)
    victim = first_run_started("host-down")
    os.killpg(chaos.owner_of(victim["pid"]).process.pid, signal.SIGKILL)

    # Its running task comes back after the lease; anything it had reserved, after the dispatch timeout.
    records = wait_for_records((r.id for r in results), timeout=60)
    assert [e["n"] for e in starts("host-down")] == [0, 0, 1, 2, 3, 4]
    assert_serial(read_history())
    assert {records[r.id].status for r in results} == {"succeeded"}


def test_a_stalled_holder_is_fenced_and_cannot_release_the_key(chaos):
    chaos.start(2)
    results = submit(chaos, "stall", 4, linger=1.0)
    victim = first_run_started("stall")
    os.kill(victim["pid"], signal.SIGSTOP)
    try:
        # The others go on: the stalled run's lease expires and its ticket is dispatched again.
        wait_for_records((r.id for r in results), timeout=60)
    finally:
        os.kill(victim["pid"], signal.SIGCONT)
    late = wait_until(
        lambda: [e for e in read_history() if e["event"] == "end" and (e["n"], e["attempt"]) == (0, 1)],
        timeout=20,
        message="the stalled run to end",
    )
    assert late[0]["holds"] is False, "a run whose lease was lost sees it has lost its key"
    ends = [(e["n"], e["attempt"], e["holds"]) for e in read_history() if e["event"] == "end"]
    assert ends[:4] == [(0, 2, True), (1, 1, True), (2, 1, True), (3, 1, True)]
    # Its late finish released nothing and started nothing.
    time.sleep(1)
    assert [e["n"] for e in starts("stall")] == [0, 0, 1, 2, 3]
    assert not get_gate().inspect("stall").holders


def test_a_message_lost_before_the_broker_is_published_again(chaos):
    results = submit(chaos, "dropped", 3, linger=0)
    # No worker yet: the granted message sits in the broker. Lose it, as if the producer died first.
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    assert broker.delete(chaos.queue) == 1
    lost_at = time.time()
    chaos.start(1)
    records = wait_for_records(r.id for r in results)
    runs = starts("dropped")
    assert [e["n"] for e in runs] == [0, 1, 2]
    waited = runs[0]["t"] - lost_at
    assert TIMINGS["DISPATCH_TIMEOUT_SECONDS"] - 0.5 < waited < TIMINGS["DISPATCH_TIMEOUT_SECONDS"] + RECOVERY_BOUND
    assert {records[r.id].status for r in results} == {"succeeded"}


def test_a_process_killed_before_starting_the_task_it_kept_loses_nothing(chaos):
    chaos.start(2)
    first = returning_step.apply_async(("kept", 0, 1.0, 60), queue=chaos.queue)
    parked = [returning_step.apply_async(("kept", n, 0.0, 0.0), queue=chaos.queue) for n in (1, 2, 3)]
    # Task 0 finished and granted task 1 to its own process, which lingers before starting it.
    returned = wait_until(lambda: [e for e in read_history() if e["event"] == "returned" and e["n"] == 0], timeout=30)
    os.kill(returned[0]["pid"], signal.SIGKILL)
    killed_at = time.time()

    records = wait_for_records((r.id for r in [first, *parked]), timeout=60)
    runs = starts("kept")
    assert [e["n"] for e in runs] == [0, 1, 2, 3]
    # Task 1 was granted to the process with no broker message, and started by the finish that kept it:
    # its lease ran out (not the dispatch timeout, 3 s here), then the reaper dispatched it again.
    waited = runs[1]["t"] - killed_at
    lease, reap = TIMINGS["LEASE_SECONDS"], TIMINGS["REAP_INTERVAL_SECONDS"]
    assert lease - 1.0 < waited < lease + 2 * reap + 0.6 < TIMINGS["DISPATCH_TIMEOUT_SECONDS"]
    assert {records[r.id].status for r in [first, *parked]} == {"succeeded"}
    assert [e["n"] for e in runs].count(1) == 1, "the kept task ran once"
    assert records[parked[0].id].attempts == 2, "its process held it when killed: a lost run, counted"
    assert not get_gate().inspect("kept").holders


def test_warm_shutdown_finishes_the_running_task_and_hands_its_key_on(chaos):
    chaos.start(2)
    results = submit(chaos, "warm", 3, linger=2.0)
    victim = first_run_started("warm")
    owner = chaos.owner_of(victim["pid"])
    owner.process.send_signal(signal.SIGTERM)
    assert owner.process.wait(30) == 0

    records = wait_for_records(r.id for r in results)
    assert [(e["n"], e["attempt"]) for e in starts("warm")] == [(0, 1), (1, 1), (2, 1)]
    assert records[results[0].id].attempts == 1, "a warm shutdown is not a lost worker"
    assert_serial(read_history())
    assert not get_gate().inspect("warm").holders


def test_after_redis_lost_everything_the_rebuild_runs_every_unfinished_task_in_order(chaos, gate_redis):
    import io

    from django.core.management import call_command

    results = [lingering_step.apply_async((f"lost-{n % 2}", n // 2), queue=chaos.queue) for n in range(8)]
    write_submission_rows()  # as a worker does within KEYED_QUEUE_RECORD_FLUSH_SECONDS
    gate_redis.flushdb()  # the gate's Redis lost everything; the broker still has the two granted messages
    call_command("keyed_queue_rebuild", stdout=io.StringIO())
    chaos.start(2)
    records = wait_for_records(r.id for r in results)
    assert {records[r.id].status for r in results} == {"succeeded"}
    starts = assert_serial(read_history())
    assert starts == {"lost-0": [0, 1, 2, 3], "lost-1": [0, 1, 2, 3]}
    assert not get_gate().inspect("lost-0").holders and not get_gate().inspect("lost-1").holders


def test_a_task_that_finished_keeps_its_record_when_its_process_is_killed_next(chaos):
    chaos.start(1, concurrency=1)  # one child process runs both tasks
    finished = lingering_step.apply_async(("done-first", 0, 0.0), queue=chaos.queue)
    victim_task = lingering_step.apply_async(("killed-next", 0, 60), queue=chaos.queue)
    victim = first_run_started("killed-next")
    os.kill(victim["pid"], signal.SIGKILL)  # well within the buffered writes' flush interval
    records = wait_for_records([finished.id], timeout=30)
    assert records[finished.id].status == "succeeded" and records[finished.id].finished_at
    wait_for_records([victim_task.id], timeout=60)
