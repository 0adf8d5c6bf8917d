"""What each key is doing now: the gate's state in Redis joined with the records.

The live keys page in the admin shows this; the most blocked keys come first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from django.db.models import Count, F, Min, Q
from django.utils import timezone

from ..conf import settings
from ..gate import Gate, HolderState, KeySnapshot
from ..process.state import get_gate
from ..records import submissions
from ..records.models import KeyedTask
from ..records.statuses import Status
from .display import at, from_epoch, since, took


@dataclass
class HolderRow:
    """One holder of a key as the live keys page shows it: the gate's ``Holder`` and its record."""

    ticket: int
    state: HolderState  # "running", "granted" (dispatched, not started yet) or "blocked" (failed, holds its key)
    lease_left: float  # seconds until the reaper may act; negative once overdue
    attempts: int
    task: KeyedTask | None  # None if the record is missing
    dispatch: int = 1  # what the release button releases: a second click of it finds the ticket moved on
    task_id: str | None = None  # the task whose message holds the slot (its record may not be written yet)

    @property
    def overdue(self) -> bool:
        return self.state != "blocked" and self.lease_left < 0

    @property
    def lease_left_text(self) -> str | None:
        return took(abs(self.lease_left))

    @property
    def held_since(self) -> datetime | None:
        """Since when it holds its key: its start when running, else its dispatch."""
        if self.task is None:
            return None
        return self.task.started_at if self.state == "running" else self.task.dispatched_at

    @property
    def held_for(self) -> str | None:
        return since(self.held_since)


def stuck_after_seconds() -> float:
    """How long past its deadline a holder is stuck: by then the reaper (every REAP_INTERVAL) should have acted."""
    return 2 * settings.REAP_INTERVAL_SECONDS


def is_stuck(snapshot: KeySnapshot) -> bool:
    """The one definition of a stuck key; the live keys page and the health view both use it.

    Nothing will move the key on its own: a holder's deadline (its lease end, or its dispatch
    deadline) passed more than two reaper periods ago, the key is paused with tasks waiting, or
    a failed task blocks it (``on_failure="block"``) until an operator retries or cancels it.
    """
    overdue = any(h.state != "blocked" and h.deadline_in < -stuck_after_seconds() for h in snapshot.holders.values())
    return overdue or (snapshot.paused and snapshot.depth > 0) or snapshot.blocked is not None


def stuck_keys(gate: Gate, *, limit: int = 1000) -> set[str]:
    """The stuck keys: the deadline index's overdue keys, the paused and the blocked keys (at most ``limit``
    of each), checked."""
    candidates = {
        *gate.overdue_keys(stuck_after_seconds(), limit=limit),
        *gate.paused_keys(limit=limit),
        *gate.blocked_keys(limit=limit),
    }
    return {s.key for s in gate.inspect_many(sorted(candidates), waiting_shown=0) if is_stuck(s)}


@dataclass
class KeyState:
    key: str
    paused: bool
    depth: int  # tickets waiting in the gate's queue
    oldest_wait: datetime | None  # when the longest-waiting task of the key was submitted
    holders: list[HolderRow] = field(default_factory=list)
    stuck: bool = False  # see ``is_stuck``
    blocked_by: HolderRow | None = None  # the failed task that blocks the key (``on_failure="block"``)
    paused_by: str = ""  # who paused it, as the pause said
    paused_since: datetime | None = None
    limit_override: int | None = None  # an operator's limit for the key (``set_key_limit``)
    interval_override_ms: int | None = None  # an operator's least ms between two starts (``set_key_rate``)

    @property
    def waited_for(self) -> str | None:
        return since(self.oldest_wait)

    @property
    def paused_for(self) -> str | None:
        return since(self.paused_since)

    @property
    def paused_since_at(self) -> str | None:
        return at(self.paused_since)

    @property
    def waited_seconds(self) -> float:
        return (timezone.now() - self.oldest_wait).total_seconds() if self.oldest_wait else 0.0

    def blocked_order(self) -> tuple:
        return (not self.stuck, -self.waited_seconds, -self.depth, self.key)


def live_keys(*, limit: int = 100, key: str | None = None) -> tuple[list[KeyState], bool]:
    """The keys with unfinished tasks, paused, blocked or given an operator's limit or rate, most blocked
    first; and whether more were left out.

    Two database queries and a few Redis round trips whatever the number of keys shown, each
    bounded: at most ``limit`` paused and ``limit`` blocked keys, and a key's waiting tasks are
    counted, not read.
    """
    gate = get_gate()
    # The operator sees the latest submissions also while no worker runs; a request writes a bounded batch.
    if key is None:
        submissions.write_page(gate)
    else:
        submissions.write_key(gate, key)
    active = KeyedTask.objects.active()
    if key is not None:
        active = active.filter(key=key)
    per_key = (
        active.values("key")
        .annotate(oldest=Min("enqueued_at", filter=Q(status=Status.WAITING)), n=Count("id"))
        .order_by(F("oldest").asc(nulls_last=True), "-n", "key")
    )
    found = {row["key"]: row["oldest"] for row in per_key[: limit + 1]}
    more = len(found) > limit
    if key is None:
        paused, blocked = gate.paused_keys(limit=limit), gate.blocked_keys(limit=limit)
        overridden = gate.overridden_keys(limit=limit)
        more = more or len(paused) == limit or len(blocked) == limit or len(overridden) == limit
    else:
        paused = [key] if gate.is_paused(key) else []
        blocked = overridden = [key]  # shown if the gate says it is blocked, or has an operator's limit
    keys = list(dict.fromkeys([*list(found)[:limit], *paused, *blocked, *overridden]))
    snapshots = gate.inspect_many(keys, waiting_shown=0)
    tasks = KeyedTask.objects.holding(snapshots)
    states = []
    for snapshot in snapshots:
        k = snapshot.key
        holders = [
            HolderRow(ticket, h.state, h.deadline_in, h.attempts, tasks.get((k, ticket)), h.dispatch, h.task_id)
            for ticket, h in sorted(snapshot.holders.items())
        ]
        blocked_by = next((h for h in holders if h.ticket == snapshot.blocked), None)
        has_override = snapshot.limit_override is not None or snapshot.interval_override_ms is not None
        if not (holders or snapshot.paused or k in found or has_override):
            continue  # a key searched for that has nothing now
        states.append(
            KeyState(
                k,
                snapshot.paused,
                snapshot.depth,
                found.get(k),
                holders,
                is_stuck(snapshot),
                blocked_by,
                snapshot.paused_by,
                from_epoch(snapshot.paused_since),
                snapshot.limit_override,
                snapshot.interval_override_ms,
            )  # fmt: skip
        )
    states.sort(key=KeyState.blocked_order)
    return states, more
