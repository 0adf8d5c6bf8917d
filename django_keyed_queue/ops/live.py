"""What each key is doing now: the gate's state in Redis joined with the records.

The live keys page in the admin shows this; the most blocked keys come first.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from django.db.models import Count, F, Min, Q
from django.utils import timezone

from ..conf import settings
from ..gate import Gate, HolderState
from ..records import submissions
from ..records.models import KeyedTask
from ..records.statuses import Status
from ..worker.process import get_gate


@dataclass
class HolderRow:
    """One holder of a key as the live keys page shows it: the gate's ``Holder`` and its record."""

    ticket: int
    state: HolderState  # "running", or "granted": dispatched and not started yet
    lease_left: float  # seconds until the reaper may act; negative once overdue
    attempts: int
    task: KeyedTask | None  # None if the record is missing

    @property
    def overdue(self) -> bool:
        return self.lease_left < 0


def stuck_after_seconds() -> float:
    """How long past its deadline a holder is stuck: by then the reaper (every REAP_INTERVAL) should have acted."""
    return 2 * settings.REAP_INTERVAL_SECONDS


def is_stuck(*, holders_due_in: Iterable[float], paused: bool, depth: int) -> bool:
    """The one definition of a stuck key; the live keys page and the health view both use it.

    Nothing will move the key on its own: a holder's deadline (its lease end, or its dispatch
    deadline) passed more than two reaper periods ago, or the key is paused with tasks waiting.
    """
    return any(due < -stuck_after_seconds() for due in holders_due_in) or (paused and depth > 0)


def stuck_keys(gate: Gate, *, limit: int = 1000) -> set[str]:
    """The stuck keys: the deadline index's overdue keys and the paused keys (at most ``limit`` of each), checked."""
    candidates = {*gate.overdue_keys(stuck_after_seconds(), limit=limit), *gate.paused_keys(limit=limit)}
    return {
        s.key
        for s in gate.inspect_many(sorted(candidates), waiting_shown=0)
        if is_stuck(holders_due_in=(h.deadline_in for h in s.holders.values()), paused=s.paused, depth=s.depth)
    }


@dataclass
class KeyState:
    key: str
    paused: bool
    depth: int  # tickets waiting in the gate's queue
    oldest_wait: datetime | None  # when the longest-waiting task of the key was submitted
    holders: list[HolderRow] = field(default_factory=list)

    @property
    def waited_seconds(self) -> float:
        return (timezone.now() - self.oldest_wait).total_seconds() if self.oldest_wait else 0.0

    @property
    def stuck(self) -> bool:
        return is_stuck(holders_due_in=(h.lease_left for h in self.holders), paused=self.paused, depth=self.depth)

    def blocked_order(self) -> tuple:
        return (not self.stuck, -self.waited_seconds, -self.depth, self.key)


def live_keys(*, limit: int = 100, key: str | None = None) -> tuple[list[KeyState], bool]:
    """The keys with unfinished tasks or paused, most blocked first; and whether more were left out.

    Two database queries and two Redis round trips whatever the number of keys shown, each
    bounded: at most ``limit`` paused keys, and a key's waiting tasks are counted, not read.
    """
    gate = get_gate()
    # The operator sees the latest submissions also while no worker runs; a request writes a bounded batch.
    if key is None:
        submissions.write_due(gate, batch=submissions.PAGE_BATCH, max_batches=1)
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
        paused = gate.paused_keys(limit=limit)
        more = more or len(paused) == limit
    else:
        paused = [key] if gate.is_paused(key) else []
    keys = list(dict.fromkeys([*list(found)[:limit], *paused]))
    snapshots = gate.inspect_many(keys, waiting_shown=0)
    held = Q(pk__in=[])
    for snapshot in snapshots:
        if snapshot.holders:
            held |= Q(key=snapshot.key, ticket__in=list(snapshot.holders))
    tasks = {(t.key, t.ticket): t for t in KeyedTask.objects.filter(held).defer("message", "arguments")}
    states = []
    for snapshot in snapshots:
        k = snapshot.key
        holders = [
            HolderRow(ticket, h.state, h.deadline_in, h.attempts, tasks.get((k, ticket)))
            for ticket, h in sorted(snapshot.holders.items())
        ]
        states.append(KeyState(k, snapshot.paused, snapshot.depth, found.get(k), holders))
    states.sort(key=KeyState.blocked_order)
    return states, more
