"""``rate="5/s"`` on real workers in a user's project: one key's starts at least 200 ms apart across two
workers, also when one is killed mid-run, while another key runs at full speed."""

import time

import pytest

from testproject.history_checks import assert_serial
from tests.userproject.run_checks import accepted_by
from tests.waiting import wait_until

pytestmark = pytest.mark.workers

#: The least time between two starts of a "5/s" key.
INTERVAL = 0.2


def starts(events: list[dict], key: str) -> list[float]:
    return [e["t"] for e in events if e["event"] == "start" and e["key"] == key]


def gate_starts(events: list[dict], key: str) -> list[int]:
    """The key's starts as the gate's clock has them, in ms: each start's line says the key's last start
    in the gate, its own unless the line came over an interval late (then a later one's, said twice)."""
    return sorted({e["gate_start_ms"] for e in events if e["event"] == "start" and e["key"] == key})


def test_one_key_starts_at_most_five_a_second_over_two_workers_and_a_kill(make_project):
    # The killed worker may hold a granted message it had not started: the gate publishes it again after the
    # dispatch timeout (docs/failure-modes.md, "A whole worker dies"), 300 s by default, 3 s here.
    project = make_project(KEYED_QUEUE_DISPATCH_TIMEOUT_SECONDS=3)
    doomed, _ = project.start_workers("a", "b")
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
    times = gate_starts(events, "paced:0")  # exact: no host's scheduling between the gate and a log line
    gaps = [later - earlier for earlier, later in zip(times, times[1:], strict=False)]
    assert len(times) >= 10 and min(gaps) >= INTERVAL * 1000, gaps
    assert sorted(gaps)[len(gaps) // 2] < (INTERVAL + 0.15) * 1000, "paced, not merely slow: most starts come when due"
    free_ends = [e["t"] for e in events if e["event"] == "end" and e["key"] == "free:0"]
    assert max(free_ends) - submitted < 3, "the other key is not slowed"
