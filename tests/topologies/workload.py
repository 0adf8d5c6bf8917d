"""The acceptance workload on a gate Redis other than one server, in the user's project.

Many keys with random durations, two workers (Celery's defaults), a child process
killed with SIGKILL mid-task, one key paused and resumed by the operator's commands,
and whatever else a test does meanwhile (``disrupt``). The history is then checked:
every accepted task ran once (the killed one twice), one at a time per key, in
submission order; the paused key started nothing while paused; the killed task
ran again within the lease and the reaper's period.
"""

from __future__ import annotations

import os
import signal
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from testproject.history_checks import assert_serial, check_once
from testproject.userproject.project import UserProject
from tests.userproject.run_checks import accepted_by, assert_workers_survived, check_run
from tests.waiting import wait_until

LEASE_SECONDS = 3
REAP_INTERVAL_SECONDS = 1
#: What every project of these tiers sets: recoveries within a test's time.
TIER_SETTINGS = {
    "KEYED_QUEUE_LEASE_SECONDS": LEASE_SECONDS,
    "KEYED_QUEUE_REAP_INTERVAL_SECONDS": REAP_INTERVAL_SECONDS,
    "KEYED_QUEUE_DISPATCH_TIMEOUT_SECONDS": 5,
}


def recovery_bound(project: UserProject) -> float:
    """A recovery's bound: the project's lease, the reaper's period, and slack for a loaded 2-core machine."""
    return float(project.settings["KEYED_QUEUE_LEASE_SECONDS"]) + REAP_INTERVAL_SECONDS + 4


PAUSED_KEY = "acct:1"


@dataclass
class Workload:
    """One run: ``tasks`` tasks over ``keys`` keys, one submitted every ``interval`` seconds."""

    tasks: int = 240
    keys: int = 24
    interval: float = 0.01
    durations: str = "0-0.1"
    paused_seconds: float = 2.0


@dataclass
class Run:
    """What a run did, for its checks: the accepted submissions (the victim first) and when things happened."""

    project: UserProject
    accepted: list[dict]
    victim: str
    paused_at: float
    killed_at: float
    resumed_at: float
    events: list[dict] = field(default_factory=list)


def starts(project: UserProject) -> list[dict]:
    return [e for e in project.history() if e["event"] == "start"]


def run_workload(
    project: UserProject, workload: Workload | None = None, disrupt: Callable[[], None] | None = None
) -> Run:
    """Run ``workload`` with a kill and a pause (and ``disrupt()`` once the victim is killed); check
    nothing yet (see :func:`check_strictly` and :func:`anomalies`)."""
    workload = workload or Workload()
    project.start_workers("a", "b")
    victim = accepted_by(project.produce("step", 1, 1, 0, 5.0, prefix="victim"))
    producer = project.produce("step", workload.tasks, workload.keys, workload.interval, workload.durations)
    victim_start = wait_until(
        lambda: [e for e in starts(project) if e["id"] == victim[0]["id"]], 30, 0.05, "the victim to start"
    )[0]

    # Killed first, mid-run: the pause is a command, whose start may take longer than the victim's run.
    os.kill(victim_start["pid"], signal.SIGKILL)
    killed_at = time.time()
    project.manage("keyed_queue_pause", PAUSED_KEY)
    paused_at = time.time()
    if disrupt is not None:
        disrupt()
    time.sleep(max(0.0, paused_at + workload.paused_seconds - time.time()))
    resumed_at = time.time()
    project.manage("keyed_queue_resume", PAUSED_KEY)
    accepted = [*victim, *accepted_by(producer)]
    return Run(project, accepted, victim[0]["id"], paused_at, killed_at, resumed_at)


def check_strictly(run: Run) -> list[dict]:
    """Every guarantee over the run; returns its history."""
    run.events = check_run(run.project, run.accepted, timeout=120, killed=frozenset({run.victim}))
    assert_workers_survived(run.project)  # a killed child process is replaced by its worker

    paused = [e for e in run.events if e["key"] == PAUSED_KEY and e["event"] == "start"]
    # A task of the key granted before the pause may still start; nothing granted after it.
    assert len([e for e in paused if run.paused_at < e["t"] < run.resumed_at]) <= 1, "the paused key started tasks"
    assert len([e for e in paused if e["t"] > run.resumed_at]) >= 3, "the paused key had tasks waiting to resume"

    again = [e for e in run.events if e["id"] == run.victim and e["event"] == "start"][1]
    assert again["t"] - run.killed_at <= recovery_bound(run.project), "the killed task ran again within the lease"
    return run.events


def anomalies(run: Run, *, timeout: float = 60) -> list[str]:
    """What the checks of :func:`check_strictly` find wrong in the run, as text, instead of failing.

    Waits up to ``timeout`` for every accepted task to end. The kinds: a task that never ran,
    a task that ran more often than it should, a ticket of a key given to two tasks, tasks of a
    key run at once or out of order.
    """
    ids = {a["id"] for a in run.accepted}

    def ended() -> bool:
        return ids <= {e["id"] for e in run.project.history() if e["event"] == "end"}

    try:
        wait_until(ended, timeout, 0.2, "every accepted task to end")
    except AssertionError:
        pass
    run.events = [e for e in run.project.history() if e["id"] in ids]
    found = []
    found += check_once(run.events, ids, killed={run.victim})
    holders: dict[tuple[str, int], list[str]] = defaultdict(list)
    for row in run.project.rows().values():
        if row["task_id"] in ids and row["ticket"] is not None:
            holders[(row["key"], row["ticket"])].append(row["task_id"])
    found += [f"ticket {t} of {k} given to {sorted(tasks)}" for (k, t), tasks in holders.items() if len(tasks) > 1]
    order: dict[str, list[int]] = {}
    for a in run.accepted:
        order.setdefault(a["key"], []).append(a["n"])
    try:
        assert_serial(run.events, accepted=order)
    except AssertionError as exc:
        found.append(f"exclusion or order: {exc}")
    return found
