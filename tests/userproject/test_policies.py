"""Per-key policies on real workers in a user's project: ``coalesce=True`` keeps one running and the latest waiting."""

import time

import pytest

from tests.userproject.run_checks import accepted_by
from tests.waiting import wait_until

pytestmark = pytest.mark.workers


def test_coalesce_runs_the_running_task_then_only_the_latest_of_those_submitted_meanwhile(make_project):
    project = make_project()
    project.worker("a")
    [running] = accepted_by(project.produce("latest_step", 1, 1, 0, 2.0, prefix="sync"))
    wait_until(lambda: any(e["event"] == "start" for e in project.history()), 30, 0.05, "task 0 to start")
    meanwhile = accepted_by(project.produce("latest_step", 5, 1, 0, 0.0, prefix="sync"))
    other = accepted_by(project.produce("step", 3, 1, 0, 0.0, prefix="free"))

    latest = meanwhile[-1]["id"]
    wait_until(lambda: latest in {e["id"] for e in project.history() if e["event"] == "end"}, 30, 0.1, "the latest")
    time.sleep(1.0)  # anything else that would wrongly run has its chance to

    events = project.history()
    starts = [e["id"] for e in events if e["event"] == "start" and e["key"] == "sync:0"]
    assert starts == [running["id"], latest], "runs are task 0, then the latest submitted while it ran"
    assert {e["id"] for e in events if e["event"] == "end" and e["key"] == "free:0"} == {a["id"] for a in other}
    start_of_latest = next(e["t"] for e in events if e["event"] == "start" and e["id"] == latest)
    end_of_running = next(e["t"] for e in events if e["event"] == "end" and e["id"] == running["id"])
    assert start_of_latest >= end_of_running, "the running task was not touched"

    def rows_settled():
        rows = project.rows()
        return all(rows.get(a["id"], {}).get("status") == "superseded" for a in meanwhile[:-1])

    wait_until(rows_settled, 20, 0.2, "the superseded tasks' rows")
    rows = project.rows()
    for replaced, replacement in zip(meanwhile, meanwhile[1:], strict=False):
        assert rows[replaced["id"]]["superseded_by"] == replacement["id"]
        assert rows[replaced["id"]]["started_at"] is None
    assert rows[running["id"]]["status"] == rows[latest]["status"] == "succeeded"
