"""A submission's row in the user's project: the producer writes none, and a worker writes every one within
the record delay and a writer's pass (a task that ran writes its own), also for a producer killed with SIGKILL
right after ``delay()`` or ``apply_async_many()`` returned and for parked tasks."""

import json
import signal
import time

import pytest

from testproject.history_checks import assert_serial
from tests.waiting import wait_until

pytestmark = pytest.mark.workers

#: Run in ``manage.py shell``: a held key with 20 tasks parked behind it (the last 10 submitted in bulk, in
#: batches of 4) and 20 free keys (in bulk), then SIGKILL.
SCRIPT = """
import json, os, signal
from shop.tasks import step

ids = [step.delay("held", 0, 9).id]
ids += [step.delay("held", n, 0).id for n in range(1, 11)]
ids += [r.id for r in step.apply_async_many([("held", n, 0) for n in range(11, 21)], batch_size=4)]
ids += [r.id for r in step.apply_async_many([(f"free-{n}", 0, 0) for n in range(20)])]
print(json.dumps(ids), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


#: ``KEYED_QUEUE_RECORD_DELAY_SECONDS``'s and ``KEYED_QUEUE_RECORD_FLUSH_SECONDS``'s defaults: the project keeps them.
RECORD_DELAY_SECONDS = 5.0
RECORD_FLUSH_SECONDS = 1.0


def test_rows_of_a_producer_killed_right_after_submitting_appear_within_the_record_delay(make_project):
    project = make_project()
    project.worker("a")

    shell = project.manage("shell", "-c", SCRIPT, check=False)
    killed_at = time.monotonic()
    assert shell.returncode == -signal.SIGKILL, shell.stderr
    ids = json.loads(shell.stdout.splitlines()[-1])

    rows = wait_until(
        lambda: (r := project.rows()) and set(ids) <= set(r) and r,
        RECORD_DELAY_SECONDS + RECORD_FLUSH_SECONDS + 1.5,  # the delay, then a writer's pass
        0.02,
        "every row",
    )
    elapsed = time.monotonic() - killed_at
    parked = [rows[task_id] for task_id in ids[1:21]]
    assert [r["ticket"] for r in parked] == list(range(2, 22))
    assert {r["status"] for r in parked} == {"waiting"}, "their only other copy is in the gate"
    assert all(r["message"] for r in parked), "what a rebuild needs"

    def ended():
        events = project.history()
        return events if sum(e["event"] == "end" for e in events) == len(ids) else None

    assert_serial(wait_until(ended, 60, 0.1, "every task to end"))
    print(f"rows of a killed producer's {len(ids)} submissions appeared {elapsed:.3f}s after it died")
