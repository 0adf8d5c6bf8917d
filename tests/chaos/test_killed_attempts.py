"""A time limit ends only the attempt it names: a stalled attempt's hard or soft limit spares its replacement."""

import os
import signal
import time
from contextlib import suppress

import pytest

from testproject.demo.history import read as read_history
from testproject.demo.tasks import soft_limited_step, time_limited_step
from testproject.history_checks import assert_serial
from tests.waiting import wait_for_records, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.workers]


def stall_the_first_attempt(chaos, task, key: str):
    """Two workers; ``task`` of ``key`` (5 s an attempt) and one behind it; the first attempt
    SIGSTOPped 2 s in, so that its lease runs out and the reaper starts attempt 2 elsewhere.
    Returns the two results and the first attempt's start event."""
    chaos.start(2)
    limited = task.apply_async((key, 0, 5.0), queue=chaos.queue)
    after = task.apply_async((key, 1), queue=chaos.queue)
    first = wait_until(lambda: [e for e in read_history() if e["event"] == "start"], 30, message="a start")[0]
    time.sleep(max(0.0, first["t"] + 2 - time.time()))
    os.kill(first["pid"], signal.SIGSTOP)
    return limited, after, first


def test_the_hard_time_limit_of_a_stalled_attempt_leaves_its_replacement_holding_the_key(chaos):
    # Under a 6 s limit the stalled first attempt is killed while the second runs.
    limited, after, first = stall_the_first_attempt(chaos, time_limited_step, "tl")
    try:
        records = wait_for_records([limited.id, after.id], timeout=60)
    finally:
        with suppress(ProcessLookupError):  # killed by its time limit, as expected
            os.kill(first["pid"], signal.SIGCONT)

    history = read_history()
    ends = [(e["n"], e["attempt"], e["holds"]) for e in history if e["event"] == "end"]
    assert ends == [(0, 2, True), (1, 1, True)], "the replacement kept its key to its end; the killed run never ended"
    assert (records[limited.id].status, records[limited.id].attempts) == ("succeeded", 2)
    assert records[after.id].status == "succeeded"
    assert_serial(history)  # the next task started after the replacement ended


def _pending_signals(pid: int) -> int:
    """Signals sent to process ``pid`` and not yet delivered, as a mask: bit ``n - 1`` is signal ``n``."""
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1], 16) for line in status if line.startswith("ShdPnd:"))


def test_the_soft_time_limit_of_a_stalled_attempt_ends_only_that_attempt(chaos):
    # Under a 6 s soft limit: at 6 s Celery sends attempt 1's process SIGUSR1, pending while it is stopped.
    limited, after, first = stall_the_first_attempt(chaos, soft_limited_step, "sl")
    owner = chaos.owner_of(first["pid"])
    run = f"{soft_limited_step.name}[{limited.id}]"
    try:
        wait_until(lambda: [e for e in read_history() if e.get("attempt") == 2], 30, 0.02, "attempt 2 to start")
        usr1 = 1 << (signal.SIGUSR1 - 1)
        wait_until(lambda: _pending_signals(first["pid"]) & usr1, 30, 0.02, "the soft time limit's SIGUSR1")
    finally:
        os.kill(first["pid"], signal.SIGCONT)  # attempt 1 wakes into SoftTimeLimitExceeded
    # Its end was fenced, so Celery ignores the run (logged after it went through _finish).
    wait_until(lambda: f"{run} ignored" in owner.log(), 10, 0.02, "attempt 1's end")
    assert not [e for e in read_history() if e["event"] == "end" and e["n"] == 0], "attempt 1 ends while 2 runs"
    assert limited.state != "FAILURE", "a caller waiting on the result never sees the fenced attempt's failure"

    wait_until(lambda: len([e for e in read_history() if e["event"] == "end"]) == 2, 30, message="two ends")
    history = read_history()
    # Attempt 1 raised before its end; task 1 started only after attempt 2 ended, still holding the key.
    events = [(e["event"], e["n"], e["attempt"]) for e in history]
    assert events == [("start", 0, 1), ("start", 0, 2), ("end", 0, 2), ("start", 1, 1), ("end", 1, 1)], events
    ends = [(e["n"], e["attempt"], e["holds"]) for e in history if e["event"] == "end"]
    assert ends == [(0, 2, True), (1, 1, True)], "the replacement kept its key to its end"
    assert_serial(history)
    # The record follows attempt 2: attempt 1's failure is neither its status nor its error.
    records = wait_for_records([limited.id, after.id], timeout=30)
    assert (records[limited.id].status, records[limited.id].attempts, records[limited.id].error) == ("succeeded", 2, "")
    assert records[after.id].status == "succeeded"
    # Records move only forward by attempt, so they would not show a fenced run's end written anyway:
    # the log says that attempt 1's finish was refused by the gate.
    log = owner.log()
    assert f"Soft time limit (6s) exceeded for {run}" in log
    assert f"{run} finished after losing its lease (fenced)" in log
    assert f"{run} raised unexpected" not in log
    assert limited.get(timeout=10) == 0, "the result is the replacement's"
