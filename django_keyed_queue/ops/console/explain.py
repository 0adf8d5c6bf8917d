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

from celery import current_app
from django.utils import timezone

from ...exceptions import MessageRefused
from ...gate import Holder, KeySnapshot
from ...gate.views import ConsoleGate
from ...messaging.message import TaskMessage, sent_eta
from ...messaging.recovered import stopped_text
from ...process.state import console_gate
from ...records import idempotency
from ...records.models import KeyedTask
from ...records.statuses import TERMINAL_STATUSES, Status
from ...worker.attempt_errors import lost_process
from ..actions.lookup import latest_row, registered_task
from ..display import at, did, from_epoch, last_line, rate_said, since, took
from .live import at_lease_end, may_be_lost, state_said, unrenewed_said
from .workers import unconsumed


@dataclass(frozen=True)
class Holding:
    """A ticket of the key that holds one of its slots: the task ahead (or the task itself)."""

    ticket: int
    state: str  # "running", "granted" (dispatched, not started) or "blocked" (failed, keeps its slot)
    task: KeyedTask | None  # None while its record is not written
    #: Since when it holds: its start when running, else its dispatch (or its submission).
    since: datetime | None
    #: The slot as the gate has it.
    slot: Holder | None = None

    @property
    def held_for(self) -> str | None:
        return since(self.since)

    @property
    def name(self) -> str:
        if self.task is not None:
            return f"{self.task.task_name}[{self.task.task_id}]"
        task_id = self.slot.task_id if self.slot is not None else None
        return f"task {task_id} (no record yet)" if task_id else "a task whose message is gone (no record)"

    @property
    def state_said(self) -> str:
        return state_said(self.state, self.task)

    @property
    def attempt(self) -> str:
        """Which attempt holds the slot, when not its first: " (attempt 2)"; a ticket is no name (tickets restart)."""
        if self.slot is None:
            return ""
        attempt = self.slot.attempts if self.state == "running" else self.slot.attempts + 1
        return f" (attempt {attempt})" if attempt > 1 else ""

    def describe(self) -> str:
        worker = self.task.worker if self.task and self.task.worker else ""
        held = f" for {since(self.since)}" if self.since else ""
        if self.state == "running":
            dead = _dead_run(self.task, self) if self.task else []
            running = f"{self.name}{self.attempt} holds the key: running{held}{f' on {worker}' if worker else ''}"
            return f"{running}; {dead[0]}" if dead else running
        if self.state == "blocked":
            return (
                f"{self.name} failed and blocks the key (on_failure='block'): nothing more of it "
                "runs until an operator retries or cancels that task"
            )
        if self.state == "waiting_for_pool":
            return f"{self.name}{self.attempt} holds the key: waiting for its pool"
        return f"{self.name}{self.attempt} holds the key: dispatched{held}, not started by a worker yet"

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
    #: The tasks holding the slots of the pool it waits for (the first few, longest held first).
    pool_holders: list[PoolHolder] = field(default_factory=list)

    @property
    def waits(self) -> bool:
        return self.state in ("waiting", "not due yet", "dispatched")

    @property
    def history(self) -> list[str]:
        """What happened to its earlier attempts, oldest first, as its record's notes keep it: which worker
        ran each one a recovery or a release ended, from when, and how it ended."""
        return [line for line in self.task.notes.splitlines() if line.strip()]

    def __str__(self) -> str:
        history = [f"  - {line}" for line in self.history]
        return "\n".join([f"{self.task.task_name}[{self.task.task_id}] key {self.task.key!r}: {self.state}",
                          *(f"  - {reason}" for reason in self.reasons),
                          *(["  history:", *history] if history else [])])  # fmt: skip

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
            "history": self.history,
            "pool_holders": [{"task_name": h.task_name, "task_id": h.task_id} for h in self.pool_holders],
        }


#: How far into a pool's line an explanation looks for the task's place.
POOL_LINE_SHOWN = 1000


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
    gate = console_gate()
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
        ended = _ended(task)
        if own is None or own.state != "blocked":
            return ended
        blocks = "it blocks its key (on_failure='block'): nothing more of the key runs until it is retried or cancelled"
        return replace(ended, state="failed, blocking its key", reasons=[blocks, *ended.reasons], own_slot=own_slot)
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
    """The task holds a slot of its key: granted and not started, running, or failed and blocking it.
    What holds it most is said first: a dead run, a recovery, a time it may not start before."""
    task = key_state.task
    if own.state == "blocked":
        why = "it failed and blocks its key (on_failure='block'): retry or cancel it to let the key move on"
        return replace(key_state, state="blocking its key", reasons=[why, *_error(task)])
    if own.state == "running":
        state = "retrying" if task.status == Status.RETRYING else "running"
        worker = f" on {task.worker}" if task.worker else ""
        # Its start not recorded yet (its worker writes it within a records pass): no time is made up.
        held = f"it holds its key: {state}" + (f" for {since(own.since)}" if own.since else "") + worker
        return replace(key_state, state=state, reasons=[*_being_stopped(own), *_dead_run(task, own), held])
    if own.state == "waiting_for_pool":
        pool = getattr(registered_task(None, task.task_name), "serial_pool", None)
        held = "it holds its key" + (f" ({since(own.since)} so far)" if own.since else "")
        held += ", and is published again once its pool gives it a slot"
        wait, holders = pool_wait(pool, task.key, own.ticket)
        return replace(key_state, state="waiting for its pool", reasons=[wait, held], pool_holders=holders)
    recovered = _recovered(task)
    reasons = [*recovered]
    if own.slot is not None and own.slot.run_now:
        ran_now = "an operator ran it now: a worker starts it at once, whatever its key's rate or debounce"
        return replace(key_state, state="dispatched", reasons=[ran_now, *reasons])
    registered = registered_task(None, task.task_name)
    interval_ms = snapshot.interval_override_ms or getattr(registered, "serial_interval_ms", 0)
    now = timezone.now()
    next_slot = None
    if interval_ms and snapshot.since_last_start is not None:
        next_slot = max(interval_ms / 1000 - snapshot.since_last_start, 0.0)
        if next_slot > 0:
            by = " (an operator's, over its task's)" if snapshot.interval_override_ms else ""
            # A worker that found it early holds its message until the slot it was told then.
            told = "; a worker told to wait under an earlier rate starts it when told" if by else ""
            reasons.append(
                f"it starts at {at(now + timedelta(seconds=next_slot))}, in {took(next_slot)}: its key's rate{by} "
                f"is {rate_said(interval_ms)}{told}"
            )
    eta = _eta(task) if getattr(registered, "serial_debounce_ms", 0) else None  # its message decoded only then
    if eta is not None and eta > now:
        reasons.append(
            f"it starts at {at(eta)}, in {took(eta - now)}: it is debounced, and a newer submission of its task "
            "replaces it until then"
        )
    if task.status == Status.RETRYING:
        reasons.append("its retry's countdown runs: it keeps its key until then")
    waits_for_time = len(reasons) > len(recovered)
    if not waits_for_time:
        reasons += unconsumed(task, own.since)
    waits = "not started by a worker yet" if waits_for_time else "waiting for a worker to start it"
    dispatched = f"dispatched {since(own.since)} ago" if own.since else "dispatched"
    reasons.append(f"it holds its key: {dispatched}, {waits}")
    return replace(key_state, state="dispatched", reasons=reasons, next_slot_in=next_slot)


@dataclass(frozen=True)
class PoolHolder:
    """A task holding a slot of a pool, as its stored message names it."""

    task_name: str
    task_id: str

    def __str__(self) -> str:
        return f"{self.task_name}[{self.task_id}]"


#: How many of a pool's holders an explanation names (longest held first): a pool may have hundreds.
POOL_HOLDERS_SHOWN = 5


def pool_wait(pool: str | None, key: str, ticket: int) -> tuple[str, list[PoolHolder]]:
    """Why a task waits for its pool, as the pool has it now, and who holds its slots: "waiting for pool
    'payments' (2 of 2 running: tasks.charge[1a2b...], tasks.charge[9f8e...]); it is next in its pool's line"."""
    if pool is None:
        return "waiting for its pool (its task, not registered here, does not say which)", []
    gate = console_gate()
    state = gate.inspect_pool(pool, waiting_shown=POOL_LINE_SHOWN)
    holders = _pool_holders(gate, state.running[:POOL_HOLDERS_SHOWN])
    limit = f"{len(state.running)} of {state.limit} running" if state.limit else f"{len(state.running)} running"
    if holders:
        more = len(state.running) - len(holders)
        limit += ": " + ", ".join(map(str, holders)) + (f" and {more} more" if more else "")
    rate = f", at most {rate_said(state.interval_ms)}" if state.interval_ms else ""
    line = state.waiting_first
    place = line.index((key, ticket)) if (key, ticket) in line else None
    ahead = (
        f"; {place} task{'s' if place != 1 else ''} of the pool wait{'s' if place == 1 else ''} ahead of it"
        if place
        else "; it is next in its pool's line"
        if place == 0
        else f"; {state.waiting} tasks wait in its pool's line"
    )
    return f"waiting for pool {pool!r} ({limit}{rate}){ahead}", holders


def _pool_holders(gate: ConsoleGate, running: list[tuple[str, int, float]]) -> list[PoolHolder]:
    """The tasks of ``running`` (a pool's slots), as their stored messages name them; one round trip. A slot
    whose message is gone or unreadable (someone else's) is left out."""
    holders = []
    for raw in gate.stored_messages([(key, ticket) for key, ticket, _ in running]):
        try:
            task_name, task_id, _ = TaskMessage.peek(raw) if raw else ("", "", {})
        except MessageRefused:
            continue
        if task_id:
            holders.append(PoolHolder(task_name, task_id))
    return holders


def _being_stopped(own: Holding) -> list[str]:
    """A run an operator stopped, or Celery is killing, first: its key waits for it to end."""
    stopping = own.slot.stopping if own.slot is not None else None
    if stopping is None:
        return []
    ago = since(from_epoch(stopping.since_ms / 1000))
    return [f"it is being ended: {stopped_text(stopping)}, {ago} ago; its key moves on once the run has ended "
            "(its worker sees its process gone, or its lease ends unrenewed)"]  # fmt: skip


def _dead_run(task: KeyedTask, own: Holding) -> list[str]:
    """A running holder that may no longer run, first: Celery reported its process lost, or its worker
    stopped renewing its lease (the gate's deadline says when it last did). It keeps its key until the
    lease ends (a run is never assumed dead)."""
    assert own.slot is not None
    if task.error.startswith(lost_process(own.slot.dispatch)):
        return [f"Celery reported its worker process lost: {last_line(task.error)}; {at_lease_end(own.slot)}"]
    overdue = own.slot.deadline_in <= 0
    return [unrenewed_said(own.slot, task.worker)] if may_be_lost(own.slot) or overdue else []


def _recovered(task: KeyedTask) -> list[str]:
    """What a recovery or an operator did to a dispatched task, first: why it runs again."""
    if task.status != Status.DISPATCHED or not task.error or not task.attempts:
        return []
    return [f"{task.error} ({since(task.dispatched_at)} ago)" if task.dispatched_at else task.error]


def _error(task: KeyedTask) -> list[str]:
    """The error's last line, as a summary says it; nothing if it has none."""
    line = last_line(task.error)
    return [f"error: {line}"] if line else []


def _eta(task: KeyedTask) -> datetime | None:
    """When the message the task was sent with may start (Celery's ``eta``), read as the app accepts it."""
    try:
        return sent_eta(TaskMessage.decode(task.message.encode(), current_app.conf.accept_content))
    except (MessageRefused, AttributeError):
        return None


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
        holdings.append(
            Holding(
                ticket, holder.state, row, started if holder.state in ("running", "blocked") else dispatched, holder
            ),
        )
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
    reasons = [f"it {did(task.status)} at {at(task.finished_at)}" if task.finished_at else f"it {did(task.status)}"]
    reasons += _error(task)
    if task.retried_as:
        reasons.append(f"an operator retried it as {task.retried_as}")
    if task.superseded_by:
        runs = idempotency.resolve(console_gate(), task.task_id, task.key)
        later = f", itself replaced in turn: {runs} is the one that runs" if runs != task.superseded_by else ""
        reasons.append(f"a newer submission of its task, {task.superseded_by}, replaced it while it waited{later}")
    return Explanation(task, task.status, reasons)
