"""The failover checks name each way a lost write shows: they must not pass a run that went wrong."""

from __future__ import annotations

from .workload import Run, anomalies


class Recorded:
    """A finished project's history and records, as a run left them."""

    def __init__(self, events: list[dict], rows: list[dict]) -> None:
        self.events, self.rows_ = events, rows

    def history(self) -> list[dict]:
        return self.events

    def rows(self) -> dict[str, dict]:
        return {row["task_id"]: row for row in self.rows_}


def _run(events: list[dict], rows: list[dict], accepted: list[tuple[str, int, str]]) -> Run:
    project = Recorded(events, rows)
    submitted = [{"key": key, "n": n, "id": task_id, "t": 0.0} for key, n, task_id in accepted]
    return Run(project, submitted, victim="v", paused_at=0, killed_at=0, resumed_at=0)  # type: ignore[arg-type]


def _ran(key: str, n: int, task_id: str) -> list[dict]:
    return [{"event": event, "key": key, "n": n, "id": task_id} for event in ("start", "end")]


def test_a_clean_run_has_none():
    events = [*_ran("a", 0, "a0"), *_ran("a", 1, "a1")]
    rows = [{"task_id": "a0", "key": "a", "ticket": 1}, {"task_id": "a1", "key": "a", "ticket": 2}]
    assert anomalies(_run(events, rows, [("a", 0, "a0"), ("a", 1, "a1")]), timeout=0) == []


def test_each_kind_is_named():
    # a1 lost; a0 ran again after its end; b0 and b1 given one ticket; b1 started while b0 ran.
    events = [
        *_ran("a", 0, "a0"),
        *_ran("a", 0, "a0"),
        {"event": "start", "key": "b", "n": 0, "id": "b0"},
        {"event": "start", "key": "b", "n": 1, "id": "b1"},
        {"event": "end", "key": "b", "n": 0, "id": "b0"},
        {"event": "end", "key": "b", "n": 1, "id": "b1"},
    ]
    rows = [
        {"task_id": "a0", "key": "a", "ticket": 1},
        {"task_id": "b0", "key": "b", "ticket": 1},
        {"task_id": "b1", "key": "b", "ticket": 1},
    ]
    found = anomalies(_run(events, rows, [("a", 0, "a0"), ("a", 1, "a1"), ("b", 0, "b0"), ("b", 1, "b1")]), timeout=0)
    assert found == [
        "never ran: a1",
        "ran 2 times: a0",
        "ticket 1 of b given to ['b0', 'b1']",
        "exclusion or order: key b: [0, 1] ran at once",
    ]
