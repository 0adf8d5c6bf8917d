"""Pools on real workers in a user's project: a limit and a rate shared by every key and worker.

Two workers of four processes each, forty keys and tasks of no key (``@pooled_task``): pool "three" never
has more than three tasks running (read from the tasks' own starts and ends, in the order the history file
has them), pool "five_a_second" never starts more than five in a second, and each key's tasks still run one
at a time, in order.
"""

import json
import os
import time

import pytest

from testproject.history_checks import assert_serial
from tests.userproject.run_checks import accepted_by, check_run
from tests.waiting import wait_until

pytestmark = pytest.mark.workers


def most_running(events: list[dict], ids: set[str]) -> int:
    """The most of ``ids`` between their start and their end at once, in the history's order."""
    running, most = set(), 0
    for e in events:
        if e["id"] not in ids:
            continue
        if e["event"] == "start":
            running.add(e["id"])
        elif e["event"] == "end":
            running.discard(e["id"])
        most = max(most, len(running))
    return most


def test_a_pool_of_three_runs_three_at_once_over_forty_keys_tasks_of_no_key_and_two_workers(make_project):
    project = make_project()
    project.start_workers("a", "b", concurrency=4)
    keyed = project.produce("pooled_step", 80, 40, 0, "0.05-0.15", prefix="pooled")
    plain = project.produce("plain_pooled_step", 30, 30, 0, "0.05-0.15", prefix="plain")  # no key: the pool alone
    accepted = accepted_by(keyed) + accepted_by(plain)
    free = accepted_by(project.produce("step", 40, 40, 0, 0.1, prefix="free"))

    ids = {a["id"] for a in accepted}
    every = ids | {a["id"] for a in free}
    wait_until(lambda: every <= {e["id"] for e in project.history() if e["event"] == "end"}, 90, 0.2, "every task")
    events = project.history()

    assert_serial(events)  # each key's tasks one at a time, in order
    assert most_running(events, ids) == 3, "the pool's three slots are all used, and never a fourth"
    assert most_running(events, {a["id"] for a in free}) > 3, "tasks of no pool are not held to it"


def test_a_pool_rate_of_five_a_second_over_keys_and_two_workers(make_project):
    project = make_project()
    project.start_workers("a", "b", concurrency=4)
    accepted = accepted_by(project.produce("rated_pool_step", 20, 10, 0, 0, prefix="rated"))

    ids = {a["id"] for a in accepted}
    wait_until(lambda: ids <= {e["id"] for e in project.history() if e["event"] == "end"}, 60, 0.2, "every task")
    events = project.history()
    assert_serial(events)

    # The gate's own start times (its clock): one start per 200 ms at most, so never six in a second.
    gate_starts = sorted({e["gate_start_ms"] for e in events if e["event"] == "start" and e["id"] in ids})
    gaps = [later - earlier for earlier, later in zip(gate_starts, gate_starts[1:], strict=False)]
    assert len(gate_starts) >= 15 and min(gaps) >= 200, gaps
    # And as the tasks saw it: six starts span a second, less the lag of a log line behind its start.
    starts = sorted(e["t"] for e in events if e["event"] == "start" and e["id"] in ids)
    assert min(b - a for a, b in zip(starts, starts[5:], strict=False)) > 0.9
    assert starts[-1] - starts[0] < 20 * 0.2 + 2, "paced, not merely slow"


def test_a_killed_worker_s_pool_slots_return_at_its_leases_end_and_the_pool_never_exceeds_its_limit(make_project):
    """SIGKILL to a worker running the pool's tasks: their runs are recovered and run again, the slots they
    held return by their leases' end, and at no moment do more than three of the pool's runs live."""
    # The first three runs take the pool's three slots for 4 s, so the kill lands in their bodies: a kill after
    # a body's last line but before its finish reaches the gate is recovered and runs again, as it must, and
    # would read here as a double run. Worker a may also have fetched (Celery's prefetch) a grant's message and
    # die with it unacknowledged, as plain Celery loses one: the reaper publishes such a grant again at its
    # dispatch timeout, 10 s here, not the default 300.
    project = make_project(KEYED_QUEUE_DISPATCH_TIMEOUT_SECONDS=10)
    doomed = project.worker("a", concurrency=4)
    accepted = accepted_by(project.produce("pooled_step", 24, 12, 0, "4,4,4,0.6", prefix="pooled"))
    wait_until(lambda: sum(e["event"] == "start" for e in project.history()) >= 3, 30, 0.05, "the pool's three runs")
    dead = {e["pid"] for e in project.history() if e["event"] == "start"}
    doomed.kill()  # SIGKILL to worker a and its pool, mid-run
    note(project, "killed")
    project.worker("b", concurrency=4)

    killed = cut_short(project.history(), dead)
    assert len(killed) == 3, f"the kill lands in the three long runs' bodies: {project.history()}"
    events = check_run(project, accepted, timeout=90, killed=frozenset(killed))

    live, most = set(), 0
    for e in project.history():
        if e["event"] == "killed":
            live = {run for run in live if run[1] not in dead}  # the killed runs ended with their processes
        elif e["event"] == "start":
            live.add((e["id"], e["pid"]))
        elif e["event"] == "end":
            live.discard((e["id"], e["pid"]))
        most = max(most, len(live))
    assert most == 3, "never a fourth run beside the killed ones' recoveries"
    assert len(events) >= 2 * len(accepted)


def note(project, event: str, task_id: str = "") -> None:
    """A line in the project's history, in order with the tasks' own (appended as they append theirs)."""
    fd = os.open(project.directory / "history.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps({"event": event, "key": "", "n": 0, "id": task_id, "pid": 0}) + "\n").encode())
    finally:
        os.close(fd)


def cut_short(events: list[dict], pids: set[int]) -> set[str]:
    """The tasks whose run in one of ``pids`` started and never ended."""
    started = {e["id"] for e in events if e["event"] == "start" and e["pid"] in pids}
    return started - {e["id"] for e in events if e["event"] == "end" and e["pid"] in pids}


def test_stopped_pooled_runs_give_their_pool_slots_back_when_their_processes_end(make_project):
    """Two Stops of a full pool's runs: the tasks waiting for the pool start once those processes are gone,
    not at the stopped runs' leases' end (30 s here), and the pool never runs more than three."""
    project = make_project(KEYED_QUEUE_LEASE_SECONDS=30)
    project.worker("a", concurrency=4)
    accepted = accepted_by(project.produce("pooled_step", 5, 5, 0, 15, prefix="pooled"))
    ids = {a["id"] for a in accepted}
    running = wait_until(
        lambda: len(s := {e["id"] for e in project.history() if e["event"] == "start"}) == 3 and s, 30, 0.05
    )
    stopped = sorted(running)[:2]
    wait_until(lambda: all(project.rows().get(i, {}).get("worker") for i in stopped), 20, 0.1, "their workers")
    stopped_at = time.time()
    for task_id in stopped:
        note(project, "stopping", task_id)  # before its process is killed, so before its slot can go back
        project.manage("keyed_queue_stop", task_id, "--signal", "SIGKILL")

    waiting = ids - running
    starts = wait_until(
        lambda: len(s := [e for e in project.history() if e["event"] == "start" and e["id"] in waiting]) == 2 and s,
        30,
        0.05,
        "the pool's waiting tasks to start",
    )
    assert max(e["t"] for e in starts) - stopped_at < 8, "they started once the stopped runs ended, not at lease end"
    wait_until(lambda: ids - set(stopped) <= project.ended(), 60, 0.2, "the others to end")
    rows = project.rows()
    assert {rows[i]["status"] for i in stopped} == {"failed"} and all(rows[i]["attempts"] == 1 for i in stopped)
    live, most = set(), 0
    for e in project.history():
        if e["event"] == "stopping":
            live.discard(e["id"])  # SIGKILLed: its run ends with its process
        elif e["event"] == "start":
            live.add(e["id"])
        elif e["event"] == "end":
            live.discard(e["id"])
        most = max(most, len(live))
    assert most == 3, "never a fourth run of the pool"
