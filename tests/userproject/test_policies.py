"""Per-key policies on real workers in a user's project: ``coalesce=True`` keeps one running and the latest waiting."""

import time

import pytest

from tests.userproject.run_checks import accepted_by
from tests.waiting import wait_until

pytestmark = pytest.mark.workers


def test_coalesce_runs_the_running_task_then_only_the_latest_of_those_submitted_meanwhile(make_project):
    project = make_project()
    project.worker("a")
    # Long enough for the next producer to start and submit on a busy machine while it runs.
    [running] = accepted_by(project.produce("latest_step", 1, 1, 0, 6.0, prefix="sync"))
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


def test_a_running_task_learns_within_half_a_second_that_a_newer_one_waits_and_stops(make_project):
    project = make_project()
    project.worker("a")
    [long] = accepted_by(project.produce("stoppable_step", 1, 1, 0, 30.0, prefix="export"))
    wait_until(lambda: any(e["event"] == "start" for e in project.history()), 30, 0.05, "the long task to start")
    time.sleep(0.3)  # it has polled a few times, and seen nothing newer
    [newer] = accepted_by(project.produce("stoppable_step", 1, 1, 0, 0.0, prefix="export"))

    wait_until(lambda: newer["id"] in {e["id"] for e in project.history() if e["event"] == "end"}, 30, 0.1, "newer")
    events = project.history()
    [stopped] = [e for e in events if e["event"] == "end" and e["id"] == long["id"]]
    assert stopped.get("superseded") is True
    assert stopped["t"] - newer["t"] < 0.5, "seen within half a second of the newer submission"
    newer_start = next(e["t"] for e in events if e["event"] == "start" and e["id"] == newer["id"])
    assert newer_start >= stopped["t"], "the newer one ran after the long one ended, not beside it"


def test_debounce_runs_only_the_last_of_a_burst_about_its_debounce_after_it_and_delays_no_other_key(make_project):
    project = make_project()
    project.worker("a")
    burst = project.produce("debounced_step", 5, 1, 0.2, 0.0, prefix="edits")
    time.sleep(0.3)
    [other] = accepted_by(project.produce("step", 1, 1, 0, 0.0, prefix="free"))
    burst = accepted_by(burst)

    last = burst[-1]
    wait_until(lambda: last["id"] in {e["id"] for e in project.history() if e["event"] == "end"}, 30, 0.05, "the last")
    time.sleep(1.0)  # anything else that would wrongly run has its chance to

    events = project.history()
    starts = [e for e in events if e["event"] == "start" and e["key"] == "edits:0"]
    assert [e["id"] for e in starts] == [last["id"]], "only the last of the burst ran"
    assert 1.4 <= starts[0]["t"] - last["t"] < 3.0, "about its debounce after the last submission"
    other_start = next(e["t"] for e in events if e["event"] == "start" and e["id"] == other["id"])
    assert other_start - other["t"] < 1.0, "another key is not delayed"
    gaps = [b["t"] - a["t"] for a, b in zip(burst, burst[1:], strict=False)]
    assert max(gaps) < 1.4, f"a burst: no quiet period of the debounce inside it {gaps}"

    def rows_settled():
        rows = project.rows()
        return all(rows.get(a["id"], {}).get("status") == "superseded" for a in burst[:-1])

    wait_until(rows_settled, 20, 0.2, "the superseded tasks' rows")
    assert project.rows()[last["id"]]["status"] == "succeeded"


def most_at_once(events: list[dict], ids: set[str]) -> int:
    """The most of ``ids`` running at once, from the history's starts and ends in file order."""
    running = most = 0
    for e in events:
        if e["id"] in ids and e["event"] in ("start", "end"):
            running += 1 if e["event"] == "start" else -1
            most = max(most, running)
    return most


def test_an_operator_raises_one_keys_limit_at_runtime_and_sets_it_back(make_project):
    project = make_project()
    project.worker("a", concurrency=4)
    said = project.manage("keyed_queue_limit", "tenant:0", "3").stdout
    assert "limit 3" in said

    raised = accepted_by(project.produce("step", 6, 1, 0, 1.0, prefix="tenant"))
    other = accepted_by(project.produce("step", 3, 1, 0, 1.0, prefix="other"))
    ids = {a["id"] for a in raised + other}
    wait_until(lambda: ids <= {e["id"] for e in project.history() if e["event"] == "end"}, 60, 0.1, "every task")
    events = project.history()
    assert most_at_once(events, {a["id"] for a in raised}) == 3, "three of the raised key at once"
    assert most_at_once(events, {a["id"] for a in other}) == 1, "another key still one at a time"

    project.manage("keyed_queue_limit", "tenant:0", "default")
    again = accepted_by(project.produce("step", 3, 1, 0, 0.5, prefix="tenant"))
    wait_until(lambda: {a["id"] for a in again} <= {e["id"] for e in project.history() if e["event"] == "end"},
               60, 0.1, "the key's tasks after default")  # fmt: skip
    assert most_at_once(project.history(), {a["id"] for a in again}) == 1, "one at a time again"
