"""A key's recent timeline as a picture: who waited and who ran when, one row per task."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.utils import timezone

from ...records.models import KeyedTask
from ...records.statuses import Status
from ..display import at

WIDTH = 860  # px of the time axis
LABEL_WIDTH = 110
ROW_HEIGHT = 18

COLOURS: dict[str, str] = {  # by status
    Status.SUCCEEDED: "#417690",
    Status.FAILED: "#ba2121",
    Status.CANCELLED: "#999999",
    Status.IGNORED: "#999999",
    Status.REJECTED: "#999999",
    Status.SUPERSEDED: "#999999",
    Status.RUNNING: "#e0a800",
    Status.RETRYING: "#e0a800",
}


@dataclass(frozen=True)
class Bar:
    y: int
    label: str
    wait_x: float  # submitted .. started (or now): waiting for the key
    run_x: float  # started .. finished (or now): holding the key
    run_end_x: float
    colour: str
    title: str
    current: bool
    task_id: str
    pk: int
    #: The first of a series of tickets after the key drained and its tickets started over at 1.
    restarts: bool = False

    @property
    def wait_width(self) -> float:
        return round(self.run_x - self.wait_x, 1)

    @property
    def run_width(self) -> float:
        return round(self.run_end_x - self.run_x, 1)


@dataclass(frozen=True)
class Timeline:
    bars: list[Bar]
    start: datetime
    end: datetime
    width: int = WIDTH
    label_width: int = LABEL_WIDTH
    row_height: int = ROW_HEIGHT

    @property
    def height(self) -> int:
        return (len(self.bars) + 1) * self.row_height + 4

    @property
    def total_width(self) -> int:
        return self.label_width + self.width + 10

    @property
    def seconds(self) -> float:
        return (self.end - self.start).total_seconds()

    @property
    def start_at(self) -> str | None:
        return at(self.start)


def key_timeline(task: KeyedTask, *, around: int = 15) -> Timeline:
    """The tasks of ``task``'s key submitted just before and after it (up to ``around`` each side), in the
    order the key took them: each series of tickets in ticket order (its records may be written in another
    order), the series in the order they began. A key's tickets start over at 1 once it drains, so older
    records share ticket numbers with newer ones; a task with no ticket (delayed, not due) ends its series."""
    rows = KeyedTask.objects.for_key(task.key).defer("message", "arguments")
    before = list(rows.filter(id__lte=task.id).order_by("-id")[: around + 1])
    after = list(rows.filter(id__gt=task.id).order_by("id")[:around])
    every_series = _series(before + after)
    tasks = [t for series in every_series for t in series]
    firsts = {series[0].pk for series in every_series[1:]}
    now = timezone.now()
    # A task's start may come before its row's submission time (a retry first on its key keeps its row).
    start = min(min(t.enqueued_at, t.started_at or t.enqueued_at) for t in tasks)
    end = max(t.finished_at or now for t in tasks)
    span = max((end - start).total_seconds(), 0.001)

    def x(moment: datetime | None) -> float:
        moment = moment or now  # not there yet: it goes on now
        return round(LABEL_WIDTH + WIDTH * (moment - start).total_seconds() / span, 1)

    bars = []
    for row, t in enumerate(tasks):
        waited_until = x(t.started_at or t.finished_at)  # a cancelled task never started
        bars.append(
            Bar(
                y=row * ROW_HEIGHT,
                label=f"#{t.ticket if t.ticket is not None else '?'} {t.status}",
                wait_x=x(t.enqueued_at),
                run_x=waited_until,
                # A run of a few ms still shows as a sliver.
                run_end_x=max(x(t.finished_at), waited_until + 2) if t.started_at else waited_until,
                colour=COLOURS.get(t.status, "#79aec8"),
                title=_describe(t),
                current=t.pk == task.pk,
                task_id=t.task_id,
                pk=t.pk,
                restarts=t.pk in firsts,
            )
        )
    return Timeline(bars, start, end)


def _series(tasks: list[KeyedTask]) -> list[list[KeyedTask]]:
    """``tasks`` split where the key's tickets started over, each series in ticket order.

    A series starts at a ticket 1 that joined the queue (a delayed task joins when due) after every
    task of the series before it had ended: only a drained key starts its tickets over. It starts there
    too when the series before already holds a ticket 1, whatever the times say: a worker's clock writes
    an end, the gate's a submission, and a clock a few ms ahead must not merge two series.
    """
    series: list[list[KeyedTask]] = [[]]
    # Tickets taken in one ms join at one time: ticket order, not the rows' (a batch writes its rows in
    # any order). Two series never share a ms: a key starts over only once its idle horizon passed.
    for t in sorted(tasks, key=lambda t: (_joined(t), *_ticket_order(t))):
        ticketed = [s for s in series[-1] if s.ticket is not None]
        drained = ticketed and all(s.finished_at and s.finished_at <= _joined(t) for s in ticketed)
        if t.ticket == 1 and (drained or any(s.ticket == 1 for s in ticketed)):
            series.append([])
        series[-1].append(t)
    return [sorted(s, key=_ticket_order) for s in series if s]


def _joined(t: KeyedTask) -> datetime:
    return max(t.enqueued_at, t.due_at or t.enqueued_at)


def _ticket_order(t: KeyedTask) -> tuple[bool, int, int]:
    """A key's order within a series: by ticket, a task with none (delayed, not due) last."""
    return (t.ticket is None, t.ticket or 0, t.id)


def _describe(t: KeyedTask) -> str:
    parts = [f"{t.task_name}[{t.task_id}] ticket {t.ticket}: {t.status}", f"submitted {at(t.enqueued_at)}"]
    if t.started_at:
        parts.append(f"started {at(t.started_at)} on {t.worker or 'an unknown worker'}")
    if t.finished_at:
        parts.append(f"finished {at(t.finished_at)}")
    return "; ".join(parts)
