"""A kill ends only the attempt it names: a stalled attempt's hard time limit leaves its replacement running."""

import os
import signal
import time
from contextlib import suppress

import pytest

from testproject.demo.tasks import time_limited_step
from tests.helpers import check_history, read_history, wait_for_records, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.workers]


def test_the_hard_time_limit_of_a_stalled_attempt_leaves_its_replacement_holding_the_key(chaos):
    chaos.start(2)
    # Every attempt runs 5 s under a 6 s limit: the stalled first one is killed while the second runs.
    limited = time_limited_step.apply_async(("tl", 0, 5.0), queue=chaos.queue)
    after = time_limited_step.apply_async(("tl", 1), queue=chaos.queue)
    first = wait_until(lambda: [e for e in read_history() if e["event"] == "start"], 30, message="a start")[0]
    time.sleep(max(0.0, first["t"] + 2 - time.time()))
    os.kill(first["pid"], signal.SIGSTOP)  # its lease runs out; the reaper starts attempt 2 elsewhere
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
    check_history(history)  # the next task started after the replacement ended
