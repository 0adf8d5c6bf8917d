"""Checks over a run in the user's project: nothing lost, nothing run twice, order kept, keys resumed."""

from __future__ import annotations

from testproject.history_checks import assert_serial, check_once
from testproject.userproject.project import UserProject
from tests.waiting import wait_until

accepted_by = UserProject.accepted


def check_run(
    project: UserProject, accepted: list[dict], *, timeout: float = 60, killed: frozenset[str] = frozenset()
) -> list[dict]:
    """Wait for every accepted task to end, then check the history and the records; returns the history.

    A task of ``killed`` (its process was killed mid-run) starts twice: the killed attempt and its recovery.
    """
    ids = {a["id"] for a in accepted}

    wait_until(lambda: ids <= project.ended(), timeout, 0.2, f"{len(ids)} accepted tasks to run")
    events = [e for e in project.history() if e["id"] in ids]
    wrong = check_once(events, ids, killed=killed, exact=True)
    assert not wrong, (
        f"a task ran twice, or a killed one was not run again: {wrong}; their events: "
        f"{[e for e in events if any(e['id'] in problem for problem in wrong)]}"
    )
    order: dict[str, list[int]] = {}
    for a in accepted:  # one producer: its submissions of a key took tickets in this order
        order.setdefault(a["key"], []).append(a["n"])
    assert assert_serial(events, accepted=order) == order, "every accepted task ran, in the gate's order"

    def recorded():
        rows = project.rows()
        return all(rows.get(task_id, {}).get("status") == "succeeded" for task_id in ids)

    wait_until(recorded, 10, 0.2, "every record to say succeeded")
    return events


def resume_delays(events: list[dict], since: float) -> dict[str, float]:
    """For each key, seconds from ``since`` to its first start after it."""
    first: dict[str, float] = {}
    for e in events:
        if e["event"] == "start" and e["t"] >= since and e["key"] not in first:
            first[e["key"]] = e["t"] - since
    return first


def assert_workers_survived(project: UserProject) -> None:
    for worker in project.workers:
        assert worker.process is not None and worker.process.poll() is None, f"worker {worker.name} exited"
        assert "Unrecoverable error" not in worker.log(), f"worker {worker.name} hit an unrecoverable error"
