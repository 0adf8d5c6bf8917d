"""What the console says is the gate's truth, on real prefork workers in a project made as users make one:
a run whose child process Celery reported lost is told so at once (not "running" for a whole lease), and a
key whose tickets started over names its new holder, not the older record with the same ticket."""

import json
import os
import signal
import time
from datetime import datetime

import pytest

from tests.userproject.run_checks import accepted_by, check_run
from tests.waiting import wait_until

pytestmark = pytest.mark.workers


def parse_moment(value) -> datetime:
    """A moment as the project's database gives it back (SQLite: text; PostgreSQL: a datetime)."""
    return value if isinstance(value, datetime) else datetime.fromisoformat(str(value))


def why(project, task_id: str) -> dict:
    return json.loads(project.manage("keyed_queue_status", "--task", task_id, "--json").stdout)


def started(project, task_id: str) -> list[dict]:
    return [e for e in project.history() if e["event"] == "start" and e["id"] == task_id]


def test_a_run_whose_child_process_was_killed_is_told_lost_until_its_lease_ends(make_project):
    project = make_project(KEYED_QUEUE_LEASE_SECONDS=8)
    project.worker("a")
    [task] = accepted_by(project.produce("step", 1, 1, 0, 4))
    wait_until(lambda: started(project, task["id"]), timeout=20)
    # "running for 1.2 s" once its worker wrote its start (within a records pass), "running" before: no time made up.
    assert why(project, task["id"])["reasons"][0].startswith("it holds its key: running")

    os.kill(started(project, task["id"])[0]["pid"], signal.SIGKILL)  # the pool child: Celery sees it exit

    def told_lost() -> list[str]:
        reasons = why(project, task["id"])["reasons"]
        return reasons if reasons[0].startswith("Celery reported its worker process lost: ") else []

    reasons = wait_until(told_lost, timeout=10)
    assert "WorkerLostError" in reasons[0] and "the reaper dispatches it again at its lease's end, in " in reasons[0]
    assert reasons[1].startswith("it holds its key: running"), "it keeps its key until its lease ends"
    check_run(project, [task], timeout=40, killed=frozenset({task["id"]}))  # recovered, run again, once at a time


def test_a_run_whose_whole_worker_was_killed_is_told_it_may_be_lost_within_two_renewal_periods(make_project):
    """SIGKILL to a worker and its pool: nothing reports it, the gate's lease deadline stops moving. Within
    two renewal periods (4 s each here) of the kill the task's first reason says its worker may be lost
    and what the reaper does at its lease's end; then it is recovered and runs again, once at a time."""
    project = make_project(KEYED_QUEUE_LEASE_SECONDS=12)
    doomed = project.worker("a")
    [task] = accepted_by(project.produce("step", 1, 1, 0, 8))
    wait_until(lambda: started(project, task["id"]), timeout=20)
    # Killed once its worker wrote the run's start (within a second), which names the worker.
    wait_until(lambda: project.rows().get(task["id"], {}).get("worker"), 20, 0.1, "the run's row")
    doomed.kill()
    killed_at = time.time()

    def told() -> list[str]:
        reasons = why(project, task["id"])["reasons"]
        return reasons if "may be lost" in reasons[0] else []

    reasons = wait_until(told, timeout=20, interval=0.2)
    assert time.time() - killed_at < 2 * 4 + 3, "told within two renewal periods (and a status command's start)"
    assert reasons[0].startswith("its worker ") and " last renewed its lease " in reasons[0], reasons
    assert "the reaper dispatches it again at its lease's end, in " in reasons[0], reasons
    assert reasons[1].startswith("it holds its key: running"), "it keeps its key until its lease ends"
    project.worker("b")
    check_run(project, [task], timeout=40, killed=frozenset({task["id"]}))

    # After the recovery: what became of attempt 1, and a wait for the key that is its first start's.
    told = wait_until(lambda: (data := why(project, task["id"]))["state"] == "succeeded" and data, timeout=20)
    [lost] = told["history"]
    assert lost.startswith("attempt 1 on a@") and ", started 20" in lost, lost
    assert lost.endswith(": its worker was lost: the lease of attempt 1 expired; dispatched again"), lost
    row = project.rows()[task["id"]]
    first, last = (parse_moment(row[f]) for f in ("first_started_at", "started_at"))
    assert first < last and (first - parse_moment(row["enqueued_at"])).total_seconds() < 5, row


def test_a_key_whose_tickets_started_over_names_its_new_holder(make_project):
    project = make_project(KEYED_QUEUE_IDLE_HORIZON_SECONDS=1)
    project.worker("a")
    [old] = accepted_by(project.produce("step", 1, 1, 0, 0))
    check_run(project, [old], timeout=20)
    time.sleep(1.5)  # the drained key's counters expire: its next ticket is 1 again
    new, behind = accepted_by(project.produce("step", 2, 1, 0, "8,0", prefix="acct"))  # new runs while we look
    wait_until(lambda: started(project, new["id"]), timeout=20)

    status = project.manage("keyed_queue_status", "--key", "acct:0").stdout
    assert f"holder shop.tasks.step[{new['id']}] (ticket 1): running" in status and old["id"] not in status
    holders = why(project, behind["id"])["holders"]
    assert [(h["ticket"], h["task_id"]) for h in holders] == [(1, new["id"])]
    check_run(project, [new, behind], timeout=30)
