"""Stop, on real prefork workers in a project made as users make one: the hung run itself ends, and its
key's next task starts only once it has; a run that outlives the signal keeps its key until SIGKILL."""

import json
import os
import time

import pytest

from tests.userproject.run_checks import accepted_by
from tests.waiting import wait_until

pytestmark = pytest.mark.workers


def events(project, task_id: str, event: str) -> list[dict]:
    return [e for e in project.history() if e["event"] == event and e["id"] == task_id]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except FileNotFoundError:
        return False


def status(project, task_id: str) -> dict:
    return json.loads(project.manage("keyed_queue_status", "--task", task_id, "--json").stdout)


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_a_hung_holder_is_stopped_and_its_key_moves_on_only_after_its_process_ended(make_project, database):
    project = make_project(database)
    project.worker("a")
    [hung] = accepted_by(project.produce("stubborn_step", 1, 1, 0, 120))
    [after] = accepted_by(project.produce("step", 1, 1, 0, 0))  # the same key
    [start] = wait_until(lambda: events(project, hung["id"], "start"), timeout=20)
    # Stop finds a run's worker in its row (written within a records pass of its start; until then it refuses).
    wait_until(lambda: project.rows().get(hung["id"], {}).get("worker"), timeout=20)

    said = project.manage("keyed_queue_stop", hung["id"]).stdout
    assert said.startswith("SIGTERM sent to worker a@") and hung["id"] in said

    # It ignores SIGTERM: it runs on, and its key waits for it, as long as it lives.
    time.sleep(3)
    assert alive(start["pid"]) and not events(project, after["id"], "start"), "its next task never starts beside it"
    reasons = status(project, hung["id"])["reasons"]
    assert reasons[0].startswith("it is being ended: stopped by ") and "(SIGTERM)" in reasons[0]
    again = project.manage("keyed_queue_stop", hung["id"], "--signal", "SIGKILL").stdout
    assert again.startswith("SIGKILL sent to worker a@") and "it was being stopped by " in again

    [next_start] = wait_until(lambda: events(project, after["id"], "start"), timeout=20)
    assert not alive(start["pid"]), "the key moved on after the stopped run's process ended"
    assert not events(project, hung["id"], "end") and len(events(project, hung["id"], "start")) == 1, (
        "the stopped run never finished, and was not dispatched again"
    )
    wait_until(lambda: events(project, after["id"], "end"), timeout=20)
    rows = wait_until(
        lambda: (
            (r := project.rows())
            and r[hung["id"]]["status"] == "failed"
            and r[after["id"]]["status"] == "succeeded"
            and r
        ),
        timeout=20,
    )
    assert rows[hung["id"]]["error"].startswith(f"stopped by {os.environ.get('USER', '')}".rstrip()) or (
        "stopped by " in rows[hung["id"]]["error"]
    )
    assert "(SIGTERM)" in rows[hung["id"]]["error"] and rows[hung["id"]]["attempts"] == 1
    assert next_start["t"] > start["t"]


def test_stop_is_refused_where_the_pool_cannot_end_a_run_and_for_a_task_that_does_not_run(make_project):
    project = make_project()
    project.worker("t", pool="threads")
    hung, after = accepted_by(project.produce("step", 2, 1, 0, "8,0.1"))
    wait_until(lambda: events(project, hung["id"], "start"), timeout=20)
    wait_until(lambda: project.rows().get(hung["id"], {}).get("worker"), timeout=20)

    refused = project.manage("keyed_queue_stop", hung["id"], check=False)
    assert refused.returncode == 1
    assert "runs Celery's threads pool, which cannot end one running task" in refused.stderr
    assert "shutdown --destination t@" in refused.stderr
    waiting = project.manage("keyed_queue_stop", after["id"], check=False)
    assert waiting.returncode == 1 and "is not running" in waiting.stderr
    assert status(project, hung["id"])["reasons"][0].startswith("it holds its key: running for ")
    wait_until(lambda: events(project, after["id"], "end"), timeout=30)  # nothing was stopped
