"""``rate="5/s"`` on real workers in a user's project: one key's starts at least 200 ms apart across two
workers, also when one is killed mid-run, while another key runs at full speed."""

import time
from datetime import datetime

import pytest

from testproject.history_checks import assert_serial
from tests.userproject.run_checks import accepted_by
from tests.waiting import wait_until

pytestmark = pytest.mark.workers

#: The least time between two starts of a "5/s" key.
INTERVAL = 0.2
#: How much later than the gate's start its worker reads its clock (``started_at``, the line after the call).
CLOCK_JITTER = 0.01


def starts(events: list[dict], key: str) -> list[float]:
    return [e["t"] for e in events if e["event"] == "start" and e["key"] == key]


def started_at(rows: dict[str, dict], key: str) -> list[float]:
    """When each task of ``key`` last started, as its worker wrote it right after the gate's start: closer
    to the gate's clock than the task's own log line, which a loaded host may write tens of ms later."""
    return sorted(datetime.fromisoformat(r["started_at"]).timestamp() for r in rows.values() if r["key"] == key)


def test_one_key_starts_at_most_five_a_second_over_two_workers_and_a_kill(make_project):
    # The killed worker may hold a granted message it had not started: the gate publishes it again after the
    # dispatch timeout (docs/failure-modes.md, "A whole worker dies"), 300 s by default, 3 s here.
    project = make_project(KEYED_QUEUE_DISPATCH_TIMEOUT_SECONDS=3)
    doomed = project.worker("a")
    project.worker("b")
    paced = accepted_by(project.produce("paced_step", 15, 1, 0, 0.05, prefix="paced"))
    free = accepted_by(project.produce("step", 20, 1, 0, 0.0, prefix="free"))
    submitted = time.time()

    wait_until(lambda: len(starts(project.history(), "paced:0")) >= 5, 20, 0.05, "five paced starts")
    doomed.kill()  # SIGKILL to worker a and its pool, holding what it had taken

    ids = {a["id"] for a in paced + free}
    wait_until(lambda: ids <= {e["id"] for e in project.history() if e["event"] == "end"}, 60, 0.2, "every task")
    events = project.history()
    assert_serial(events)  # exclusion and order on both keys

    assert len(starts(events, "paced:0")) >= 15

    def written() -> dict[str, dict]:
        rows = project.rows()
        paced_rows = [r for r in rows.values() if r["key"] == "paced:0"]
        return rows if len(paced_rows) == 15 and all(r["status"] == "succeeded" for r in paced_rows) else {}

    times = started_at(wait_until(written, 60, 0.2, "the records written"), "paced:0")
    gaps = [later - earlier for earlier, later in zip(times, times[1:], strict=False)]
    assert len(times) == 15 and min(gaps) >= INTERVAL - CLOCK_JITTER, [round(g, 3) for g in gaps]
    assert sorted(gaps)[len(gaps) // 2] < INTERVAL + 0.15, "paced, not merely slow: most starts come when due"
    free_ends = [e["t"] for e in events if e["event"] == "end" and e["key"] == "free:0"]
    assert max(free_ends) - submitted < 3, "the other key is not slowed"
