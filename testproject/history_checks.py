"""Checks over a history of task runs, shared by the tests and the benchmarks: exclusion, order, each task once.

A history is a list of events in the order they happened (the order of a Redis list's RPUSHes, or of a
file's appended lines: never clocks compared across processes). Each event is a dict with ``event``
(``"start"`` or ``"end"``; other events, such as ``"returned"``, are ignored), ``key``, and what names its
task: ``n`` (the task's number among its key's tasks, as testproject/demo/tasks.py and the user's project
log it) or ``id`` (its task id). The histories these checks read: testproject/demo/history.py's (the demo's
tasks), the user's project's ``history.jsonl`` (testproject/userproject/files/tasks.py) and the
compatibility tier's journal (testproject/compat/journal.py).

- Exclusion: at most ``limit`` tasks of a key between their start and their end at once.
- Order: the gate grants tickets first in, first out, so when a task first starts, at most ``limit - 1``
  tasks of its key accepted before it have not started yet (they hold the other slots). With ``limit``
  1 this is strict submission order.
- Each once: every task expected started, ended, and started once (twice where a run was killed on
  purpose: the killed run and its recovery).

Each check returns what it found wrong, as sentences (an empty list when all holds); the tests assert
on them (:func:`assert_serial`), the benchmarks report them.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Event = Mapping[str, Any]
#: What names an event's task (or run) within its key.
Ident = Callable[[Event], Hashable]


def by_n(event: Event) -> Hashable:
    """The task's number among its key's tasks (the demo's tasks and the user's project's)."""
    return event["n"]


def by_id(event: Event) -> Hashable:
    """The task's id."""
    return event["id"]


@dataclass
class Serial:
    """What :func:`check_serial` found: each key's tasks in the order they first started, and any problem."""

    first_starts: dict[str, list] = field(default_factory=lambda: defaultdict(list))
    problems: list[str] = field(default_factory=list)


def check_serial(
    events: Iterable[Event],
    limit: int = 1,
    accepted: Mapping[str, Sequence] | None = None,
    ident: Ident = by_n,
    run: Ident | None = None,
) -> Serial:
    """Exclusion and order over ``events``, in one pass; problems in the order the history shows them.

    For exclusion, a run lasts from a start to the next end of the same ``run`` (by default the task,
    ``ident``): so a task started again before an end (a killed run's recovery: the killed run never
    ends) counts once. Pass a ``run`` that includes the process (``lambda e: (e["id"], e["pid"])``) to
    count every run of a task apart.

    Order: a key's tasks are in the gate's accepted order, ``accepted[key]``; without it, task ``n`` was
    accepted after tasks 0 to n - 1 (the demo's and the user's project's numbering). A task missing from
    its key's accepted order comes after all of it.
    """
    serial = Serial()
    running: dict[str, dict[Hashable, None]] = defaultdict(dict)  # an ordered set: the runs in start order
    orders: dict[str, _KeyOrder] = {}
    for e in events:
        if e["event"] not in ("start", "end"):
            continue
        key, task = e["key"], ident(e)
        this_run = task if run is None else run(e)
        if e["event"] == "start":
            running[key][this_run] = None
            if len(running[key]) > limit:
                serial.problems.append(f"key {key}: {list(running[key])} ran at once")
            if key not in orders:
                orders[key] = _KeyOrder((accepted or {}).get(key) or None)
            skipped = orders[key].first_start(task)
            if skipped is not None:
                serial.first_starts[key].append(task)
                if len(skipped) > limit - 1:
                    serial.problems.append(f"key {key}: {task} started before {skipped}")
        else:
            running[key].pop(this_run, None)
    serial.first_starts = dict(serial.first_starts)
    return serial


class _KeyOrder:
    """A key's accepted order, and which of its tasks have started: each start costs about the number
    of tasks it skipped, not the length of the history (a soak's key has thousands of tasks).

    The order is ``accepted`` as given or, without it, task ``n`` after tasks 0 to n - 1. ``frontier``
    is the first place in it whose task has not started: every task before it has.
    """

    def __init__(self, accepted: Sequence | None) -> None:
        self.accepted = accepted
        self.places: dict[Hashable, int] = {}
        for place, task in enumerate(accepted or ()):
            self.places.setdefault(task, place)
        self.started: set[Hashable] = set()
        self.frontier = 0

    def first_start(self, task: Hashable) -> list | None:
        """The tasks accepted before ``task`` that have not started, if this is its first start; else None.
        A task missing from the accepted order comes after all of it."""
        if task in self.started:
            return None
        self.started.add(task)
        if self.accepted is not None:
            end, at = self.places.get(task, len(self.accepted)), self.accepted.__getitem__
            last = len(self.accepted)
        elif isinstance(task, int):
            end, at, last = task, int, None  # task n: after 0 to n - 1
        else:
            return []  # no order to keep
        while (last is None or self.frontier < last) and at(self.frontier) in self.started:
            self.frontier += 1
        return [at(place) for place in range(self.frontier, end) if at(place) not in self.started]


def assert_serial(
    events: Iterable[Event],
    limit: int = 1,
    accepted: Mapping[str, Sequence] | None = None,
    ident: Ident = by_n,
    run: Ident | None = None,
) -> dict[str, list]:
    """:func:`check_serial` for the tests: fails on its first problem (saying how many more); returns each
    key's tasks in the order they first started."""
    serial = check_serial(events, limit, accepted, ident, run)
    if serial.problems:
        more = len(serial.problems) - 1
        raise AssertionError(serial.problems[0] + (f" (and {more} more: {serial.problems[1:4]})" if more else ""))
    return serial.first_starts


def start_counts(events: Iterable[Event], tasks: Collection, ident: Ident = by_id) -> Counter:
    """How many times each task of ``tasks`` started."""
    return Counter(ident(e) for e in events if e["event"] == "start" and ident(e) in tasks)


def check_once(
    events: Iterable[Event], tasks: Collection, ident: Ident = by_id, killed: Collection = (), exact: bool = False
) -> list[str]:
    """Each task of ``tasks`` started, and not more than once (twice for one of ``killed``: its killed
    run and its recovery); with ``exact``, exactly so (a killed task that did not run again is reported)."""
    starts = start_counts(events, tasks, ident)
    problems = [f"never ran: {task}" for task in sorted(set(tasks) - set(starts), key=repr)]
    for task, count in starts.items():
        allowed = 2 if task in killed else 1
        if count > allowed or (exact and count != allowed):
            problems.append(f"ran {count} times: {task}")
    return problems


def never_ended(events: Iterable[Event], tasks: Collection, ident: Ident = by_id) -> list:
    """The tasks of ``tasks`` that have no end in ``events`` (lost, or still running)."""
    ended = {ident(e) for e in events if e["event"] == "end"}
    return sorted(set(tasks) - ended, key=repr)
