"""Why a task waits: what its key's state in the gate and the records say holds it, in words and as data.

``explain(task_id)`` answers for the task page, ``keyed_queue_status --task`` and user code alike:
the tasks ahead of it that hold its key (since when, on which worker), the key paused (by whom,
since when), blocked by a failed task, its rate's next slot, its own countdown or eta, and how
many tasks wait ahead of it. It reads; it changes nothing (one round trip for the key, one more
for its place in the queue).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from ..gate import Holder, KeySnapshot
from ..process.state import get_gate
from ..records.models import KeyedTask
from ..records.statuses import TERMINAL_STATUSES, Status
from .display import at, from_epoch, since, took
from .recovery import latest_row, registered_task


@dataclass(frozen=True)
class Holding:
    """A ticket of the key that holds one of its slots: the task ahead (or the task itself)."""

    ticket: int
    state: str  # "running", "granted" (dispatched, not started) or "blocked" (failed, keeps its slot)
    task: KeyedTask | None  # None while its record is not written
    #: Since when it holds: its start when running, else its dispatch (or its submission).
    since: datetime | None

    @property
    def held_for(self) -> str | None:
        return since(self.since)

    @property
    def name(self) -> str:
        return f"{self.task.task_name}[{self.task.task_id}]" if self.task else f"ticket {self.ticket} (no record yet)"

    def describe(self) -> str:
        worker = self.task.worker if self.task and self.task.worker else ""
        held = f" for {since(self.since)}" if self.since else ""
        if self.state == "running":
            return f"{self.name} (#{self.ticket}) holds the key: running{held}{f' on {worker}' if worker else ''}"
        if self.state == "blocked":
            return (
                f"{self.name} (#{self.ticket}) failed and blocks the key (on_failure='block'): nothing more of it "
                "runs until an operator retries or cancels that task"
            )
        return f"{self.name} (#{self.ticket}) holds the key: dispatched{held}, not started by a worker yet"

    def as_data(self) -> dict[str, Any]:
        task = self.task
        return {
            "ticket": self.ticket,
            "state": self.state,
            "task_id": task.task_id if task else None,
            "task_name": task.task_name if task else None,
            "worker": task.worker if task else None,
            "since": self.since.isoformat() if self.since else None,
        }


@dataclass(frozen=True)
class Explanation:
    task: KeyedTask
    #: "waiting", "not due yet", "dispatched", "running", "retrying", "blocking its key" or the final status.
    state: str
    #: What holds the task, most telling first, as sentences.
    reasons: list[str]
    holders: list[Holding] = field(default_factory=list)
    waiting_ahead: int | None = None
    paused: bool = False
    paused_by: str = ""
    paused_since: datetime | None = None
    blocked_by: Holding | None = None
    next_slot_in: float | None = None  # seconds until the key's rate lets a task start
    due_at: datetime | None = None  # a countdown or eta still running
    #: The slot the task's own ticket holds in the gate, if any: what the actions on it go by.
    own_slot: Holder | None = None

    @property
    def waits(self) -> bool:
        return self.state in ("waiting", "not due yet", "dispatched")

    def __str__(self) -> str:
        return "\n".join([f"{self.task.task_name}[{self.task.task_id}] key {self.task.key!r}: {self.state}",
                          *(f"  - {reason}" for reason in self.reasons)])  # fmt: skip

    def as_data(self) -> dict[str, Any]:
        task = self.task
        return {
            "task_id": task.task_id,
            "task_name": task.task_name,
            "key": task.key,
            "ticket": task.ticket,
            "state": self.state,
            "reasons": self.reasons,
            "holders": [h.as_data() for h in self.holders],
            "waiting_ahead": self.waiting_ahead,
            "paused": self.paused,
            "paused_by": self.paused_by or None,
            "paused_since": self.paused_since.isoformat() if self.paused_since else None,
            "blocked_by": self.blocked_by.as_data() if self.blocked_by else None,
            "next_slot_in": self.next_slot_in,
            "due_at": self.due_at.isoformat() if self.due_at else None,
        }


def explain(task_id: str) -> Explanation:
    """Why the task ``task_id`` (its latest submission) waits, or what it does now; ActionRefused if no
    keyed task has that id. Redis errors are raised."""
    return explain_row(latest_row(task_id))


def explain_row(task: KeyedTask) -> Explanation:
    """:func:`explain` for a record already read (the task page has it)."""
    # A failed task may still hold its key, blocking it (on_failure="block"): its actions need the gate's word.
    if task.status in TERMINAL_STATUSES and (task.status != Status.FAILED or task.ticket is None):
        return _ended(task)
    now = timezone.now()
    if task.ticket is None:
        if task.due_at is not None and task.due_at > now:
            return Explanation(task, "not due yet", [_due(task)], due_at=task.due_at)
        return Explanation(task, "waiting", [f"it joins its key's queue when a worker receives it (due since "
                                             f"{at(task.due_at or task.enqueued_at)})"])  # fmt: skip
    gate = get_gate()
    snapshot = gate.inspect(task.key, waiting_shown=0)
    holdings = _holdings(snapshot)
    own_slot = snapshot.held_by(task.ticket, task.task_id)
    own = next((h for h in holdings if own_slot is not None and h.ticket == task.ticket), None)
    others = [h for h in holdings if h is not own]
    blocked_by = next((h for h in others if h.state == "blocked"), None)
    paused_since = from_epoch(snapshot.paused_since)
    # What the key's state says, whatever the task's own: the template of every answer below.
    key_state = Explanation(
        task, task.status, [], others, None, snapshot.paused, snapshot.paused_by, paused_since, blocked_by,
        own_slot=own_slot,
    )  # fmt: skip
    if task.status in TERMINAL_STATUSES:  # its ticket's slot is its own only if it blocks the key
        return replace(_ended(task), own_slot=key_state.own_slot if own and own.state == "blocked" else None)
    if own is not None:
        return _holding(key_state, own, snapshot)
    ahead = gate.waiting_ahead(task.key, task.ticket, task.task_id)
    if ahead is None:  # neither holding nor waiting: it ended, and its record has not caught up yet
        return Explanation(task, task.status, ["the gate holds nothing of it any more: its end is being recorded"])
    reasons = []
    if snapshot.paused:
        reasons.append(_paused(snapshot, paused_since))
    if blocked_by is not None:
        reasons.append(blocked_by.describe())
    reasons += [h.describe() for h in others if h is not blocked_by]
    if not others and not snapshot.paused:
        limit = _limit(snapshot, task)
        reasons.append(f"no task holds its key (limit {limit}): it is granted at the key's next finish or reaper pass")
    elif snapshot.limit_override is not None:
        reasons.append(f"its key's limit is {_limit(snapshot, task)}")
    reasons.append(f"{ahead} task{'s' if ahead != 1 else ''} of the key wait{'s' if ahead == 1 else ''} ahead of it"
                   if ahead else "it is next in its key's queue")  # fmt: skip
    return replace(key_state, state="waiting", reasons=reasons, waiting_ahead=ahead)


def _holding(key_state: Explanation, own: Holding, snapshot: KeySnapshot) -> Explanation:
    """The task holds a slot of its key: granted and not started, running, or failed and blocking it."""
    task = key_state.task
    if own.state == "blocked":
        why = "it failed and blocks its key (on_failure='block'): retry or cancel it to let the key move on"
        return replace(key_state, state="blocking its key", reasons=[why])
    if own.state == "running":
        state = "retrying" if task.status == Status.RETRYING else "running"
        worker = f" on {task.worker}" if task.worker else ""
        return replace(key_state, state=state, reasons=[f"it holds its key: {state} for {since(own.since)}{worker}"])
    reasons = [f"it holds its key: dispatched {since(own.since)} ago, waiting for a worker to start it"]
    registered = registered_task(None, task.task_name)
    interval_ms = snapshot.interval_override_ms or getattr(registered, "serial_interval_ms", 0)
    debounce_ms = getattr(registered, "serial_debounce_ms", 0)
    if debounce_ms and task.status == Status.DISPATCHED and task.dispatched_at is not None:
        starts = task.dispatched_at + timedelta(milliseconds=debounce_ms)
        reasons.append(f"debounced: it starts at {at(starts)} unless a newer submission of its task replaces it")
    next_slot = None
    if interval_ms and snapshot.since_last_start is not None:
        next_slot = max(interval_ms / 1000 - snapshot.since_last_start, 0.0)
        if next_slot > 0:
            by = " (an operator's, over its task's)" if snapshot.interval_override_ms else ""
            reasons.append(f"its key's rate{by} lets the next task start in {took(next_slot)}")
    if task.status == Status.RETRYING:
        reasons.append("its retry's countdown runs: it keeps its key until then")
    return replace(key_state, state="dispatched", reasons=reasons, next_slot_in=next_slot)


def _limit(snapshot: KeySnapshot, task: KeyedTask) -> str:
    """The key's limit as an explanation says it: an operator's, naming its task's own, or its task's."""
    own = getattr(registered_task(None, task.task_name), "serial_limit", 1)
    if snapshot.limit_override is None:
        return str(own)
    return f"{snapshot.limit_override}, set by an operator over its task's own {own}"


def _holdings(snapshot: KeySnapshot) -> list[Holding]:
    tasks = KeyedTask.objects.holding([snapshot])
    holdings = []
    for ticket, holder in sorted(snapshot.holders.items()):
        row = tasks.get((snapshot.key, ticket))
        started = row.started_at if row else None
        dispatched = (row.dispatched_at or row.due_at or row.enqueued_at) if row else None
        holdings.append(Holding(ticket, holder.state, row, started if holder.state != "granted" else dispatched))
    return holdings


def _paused(snapshot: KeySnapshot, paused_since: datetime | None) -> str:
    by = f" by {snapshot.paused_by}" if snapshot.paused_by else ""
    when = f" since {at(paused_since)} ({since(paused_since)} ago)" if paused_since else ""
    return f"its key is paused{by}{when}: nothing of it starts until it is resumed"


def _due(task: KeyedTask) -> str:
    assert task.due_at is not None
    left = task.due_at - timezone.now()
    return f"its countdown or eta makes it due at {at(task.due_at)} (in {took(left)}); it joins its key's queue then"


def _ended(task: KeyedTask) -> Explanation:
    reasons = [f"it {task.status} at {at(task.finished_at)}" if task.finished_at else f"it {task.status}"]
    if task.retried_as:
        reasons.append(f"an operator retried it as {task.retried_as}")
    if task.superseded_by:
        reasons.append(f"a newer submission of its task, {task.superseded_by}, replaced it while it waited")
    return Explanation(task, task.status, reasons)
