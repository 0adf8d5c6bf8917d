"""The acceptance workload on a gate Redis other than one server, in the user's project.

Many keys with random durations, two workers (Celery's defaults), a pool process
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
from collections.abc import Callable
from dataclasses import dataclass

from tests.userproject.project import UserProject
from tests.userproject.runs import accepted_by, assert_workers_survived, check_run
from tests.waiting import wait_until

LEASE_SECONDS = 3
REAP_INTERVAL_SECONDS = 1
#: What every project of these tiers sets: recoveries within a test's time.
TIER_SETTINGS = {
    "KEYED_QUEUE_LEASE_SECONDS": LEASE_SECONDS,
    "KEYED_QUEUE_REAP_INTERVAL_SECONDS": REAP_INTERVAL_SECONDS,
    "KEYED_QUEUE_DISPATCH_TIMEOUT_SECONDS": 5,
}
#: A recovery's bound: the lease, the reaper's period, and slack for a loaded 2-core machine.
RECOVERY_BOUND_SECONDS = LEASE_SECONDS + REAP_INTERVAL_SECONDS + 4

PAUSED_KEY = "acct:1"


@dataclass
class Workload:
    """One run: ``tasks`` tasks over ``keys`` keys, one submitted every ``interval`` seconds."""

    tasks: int = 240
    keys: int = 24
    interval: float = 0.01
    durations: str = "0-0.1"
    paused_seconds: float = 2.0


def starts(project: UserProject) -> list[dict]:
    return [e for e in project.history() if e["event"] == "start"]


def run_workload(
    project: UserProject, workload: Workload | None = None, disrupt: Callable[[], None] | None = None
) -> list[dict]:
    """Run ``workload`` with a kill and a pause (and ``disrupt()`` once the victim is killed); check it.

    Returns the checked history.
    """
    workload = workload or Workload()
    project.worker("a")
    project.worker("b")
    victim = accepted_by(project.produce("step", 1, 1, 0, 5.0, prefix="victim"))
    producer = project.produce("step", workload.tasks, workload.keys, workload.interval, workload.durations)
    victim_start = wait_until(
        lambda: [e for e in starts(project) if e["id"] == victim[0]["id"]], 30, 0.05, "the victim to start"
    )[0]

    project.manage("keyed_queue_pause", PAUSED_KEY)
    paused_at = time.time()
    os.kill(victim_start["pid"], signal.SIGKILL)
    killed_at = time.time()
    if disrupt is not None:
        disrupt()
    time.sleep(max(0.0, paused_at + workload.paused_seconds - time.time()))
    resumed_at = time.time()
    project.manage("keyed_queue_resume", PAUSED_KEY)

    accepted = accepted_by(producer)
    events = check_run(project, [*victim, *accepted], timeout=120, killed=frozenset({victim[0]["id"]}))
    assert_workers_survived(project)  # a killed pool process is replaced by its worker

    paused = [e for e in events if e["key"] == PAUSED_KEY and e["event"] == "start"]
    # A task of the key granted before the pause may still start; nothing granted after it.
    assert len([e for e in paused if paused_at < e["t"] < resumed_at]) <= 1, "the paused key started tasks"
    assert len([e for e in paused if e["t"] > resumed_at]) >= 3, "the paused key had tasks waiting to resume"

    again = [e for e in events if e["id"] == victim[0]["id"] and e["event"] == "start"][1]
    assert again["t"] - killed_at <= RECOVERY_BOUND_SECONDS, "the killed task ran again within the lease"
    return events
