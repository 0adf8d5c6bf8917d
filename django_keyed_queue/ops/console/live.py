"""What each key is doing now: the gate's state in Redis first, joined with the records.

The live keys page in the admin shows this: the keys with work in the gate (a holder, tickets
waiting), paused, blocked or given an operator's limit, the most urgent first; then, apart, the
keys whose rows say unfinished while the gate holds nothing of them (``unheld``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from celery import current_app
from django.utils import timezone

from ...conf import settings
from ...exceptions import MessageRefused
from ...gate import Holder, HolderState, KeySnapshot, Stopping
from ...gate.listing import MatchedKeys
from ...gate.pools import Pool
from ...gate.views import ConsoleGate
from ...messaging.message import ENQUEUED_HEADER, TaskMessage
from ...messaging.recovered import stopped_text
from ...pools import configured_pools
from ...process.leases import renewal_seconds
from ...process.state import console_gate
from ...records import submissions
from ...records.models import KeyedTask
from ..actions import run_now
from ..actions.lookup import registered_task
from ..display import at, from_epoch, rate_said, since, took
from .key_fragment import KeyFragment
from .unheld import UnheldKey, oldest_unfinished, unheld

#: How many keys of the deadline index a page reads and checks, the earliest-due (the overdue) first:
#: its bound on Redis' work, whatever the number of keys (six commands a key checked).
KEYS_READ = 300
#: About how many names of the gate's lists a search of the Key box examines at most: Redis spends about
#: 0.75 ms a thousand (ZSCAN with MATCH), in steps of a thousand, so about 75 ms for a whole search.
SEARCH_BUDGET = 100_000
#: How many keys with unfinished rows and nothing in the gate the page lists apart.
UNHELD_SHOWN = 20


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
    stopping: Stopping | None = None  # who is stopping its run (it keeps the key until the run has ended)
    waits_for: str = ""  # the time a granted task waits for (its debounce, its key's rate): Run now applies
    unrenewed: str = ""  # that its worker may be lost, and what the reaper does when (see ``may_be_lost``)

    @property
    def attempt(self) -> int:
        """The attempt that holds the slot: a running or failed one's, else the one it waits to start."""
        return self.attempts if self.state in ("running", "blocked") else self.attempts + 1

    @property
    def short_id(self) -> str:
        """What its buttons name it by: its task id's first 8 characters (a ticket is no name: tickets restart)."""
        task_id = self.task.task_id if self.task is not None else self.task_id
        return task_id[:8] if task_id else "?"

    @property
    def state_said(self) -> str:
        return state_said(self.state, self.task, self.waits_for)

    @property
    def stopping_said(self) -> str | None:
        return stopped_text(self.stopping) if self.stopping is not None else None

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


def state_said(state: str, task: KeyedTask | None, waits_for: str = "") -> str:
    """A holder's state in words, never the gate's name for it: "running", "dispatched, not started yet",
    "waiting for its key's rate (...)", "waiting for pool 'payments'", "failed, blocking its key"."""
    if state == "waiting_for_pool":
        pool = getattr(registered_task(None, task.task_name), "serial_pool", None) if task else None
        return f"waiting for pool {pool!r}" if pool else "waiting for its pool"
    if state == "granted":
        return f"waiting for {waits_for}" if waits_for else "dispatched, not started yet"
    return "failed, blocking its key" if state == "blocked" else "running"


def unrenewed_after_seconds() -> float:
    """How long after its lease's last renewal a running holder's worker may be lost: half a renewal period
    late, so it is told within two periods of its last renewal (and at least a second late: the renewer's
    timer and a loaded machine's scheduling may be that late)."""
    every = renewal_seconds()
    return max(1.5 * every, every + 1.0)


def renewed_ago(holder: Holder) -> float:
    """Seconds since a running holder's lease was last renewed (or started): the gate sets its deadline a
    lease from then."""
    return float(settings.LEASE_SECONDS) - holder.deadline_in


def may_be_lost(holder: Holder) -> bool:
    """The one definition of a run whose worker may be lost, as the gate has it: running, its lease not
    renewed for ``unrenewed_after_seconds`` and not ended yet (then it is overdue: the reaper's to end). It
    keeps its key until its lease ends: a run is never assumed dead."""
    return holder.state == "running" and 0 < holder.deadline_in and renewed_ago(holder) > unrenewed_after_seconds()


def at_lease_end(holder: Holder) -> str:
    """What the reaper does to a lost run, as its recoveries left say, and when: "the reaper dispatches it
    again at its lease's end, in 18.0 s"."""
    if holder.lost < holder.max_lost:
        does = "dispatches it again"
    else:
        does = "fails it (no recovery left), and it blocks its key" if holder.blocks_on_failure else (
            "fails it (no recovery left)")  # fmt: skip
    if holder.deadline_in > 0:
        return f"the reaper {does} at its lease's end, in {took(holder.deadline_in)}"
    return f"its lease ended {took(-holder.deadline_in)} ago: the reaper {does} at its next pass"


def unrenewed_said(holder: Holder, worker: str) -> str:
    """A run whose worker may be lost (``may_be_lost``), told: ``worker`` is its worker's name, '' if unknown."""
    whose = f"its worker {worker}" if worker else "its worker"
    return f"{whose} last renewed its lease {took(renewed_ago(holder))} ago and may be lost; {at_lease_end(holder)}"


def unrenewed_runs(gate: ConsoleGate, *, limit: int = 1000) -> int:
    """How many running holders' workers may be lost (``may_be_lost``), among the ``limit`` keys the
    deadline index has due first: a lease renewed on time is due later than those."""
    due_within = float(settings.LEASE_SECONDS) - unrenewed_after_seconds()
    keys = gate.overdue_keys(-due_within, limit=limit)
    return sum(may_be_lost(h) for s in gate.inspect_many(keys, waiting_shown=0) for h in s.holders.values())


def stuck_after_seconds() -> float:
    """How long past its deadline a holder is stuck: by then the reaper (every REAP_INTERVAL) should have acted."""
    return 2 * settings.REAP_INTERVAL_SECONDS


def is_stuck(snapshot: KeySnapshot) -> bool:
    """The one definition of a stuck key; the live keys page and the health view both use it.

    Nothing will move the key on its own: a holder's deadline (its lease end, or its dispatch
    deadline) passed more than two reaper periods ago, the key is paused with tasks waiting, or
    a failed task blocks it (``on_failure="block"``) until an operator retries or cancels it.
    """
    return overdue_too_long(snapshot) or (snapshot.paused and snapshot.depth > 0) or snapshot.blocked is not None


def overdue_too_long(snapshot: KeySnapshot) -> bool:
    """A holder of the key is past its deadline by more than ``stuck_after_seconds``."""
    return any(h.state != "blocked" and h.deadline_in < -stuck_after_seconds() for h in snapshot.holders.values())


def stuck_keys(gate: ConsoleGate, *, limit: int = 1000) -> set[str]:
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
    oldest_wait: datetime | None  # since when its longest-waiting task not started yet waits (see ``_waits``)
    holders: list[HolderRow] = field(default_factory=list)
    stuck: bool = False  # see ``is_stuck``
    blocked_by: HolderRow | None = None  # the failed task that blocks the key (``on_failure="block"``)
    paused_by: str = ""  # who paused it, as the pause said
    paused_since: datetime | None = None
    limit_override: int | None = None  # an operator's limit for the key (``set_limits``)
    interval_override_ms: int | None = None  # an operator's least ms between two starts (``set_limits``)
    overdue_stuck: bool = False  # a holder is past its deadline by more than ``stuck_after_seconds``
    waits: bool = False  # a task of the key waits: in its queue, or granted and never started

    @property
    def unrenewed(self) -> bool:
        """A holder's worker may be lost (``may_be_lost``)."""
        return any(h.unrenewed for h in self.holders)

    @property
    def waited_for(self) -> str | None:
        return since(self.oldest_wait)

    @property
    def rate_override_said(self) -> str:
        return rate_said(self.interval_override_ms) if self.interval_override_ms else ""

    @property
    def paused_for(self) -> str | None:
        return since(self.paused_since)

    @property
    def paused_since_at(self) -> str | None:
        return at(self.paused_since)

    @property
    def waited_seconds(self) -> float:
        return (timezone.now() - self.oldest_wait).total_seconds() if self.oldest_wait else 0.0

    def urgency(self) -> tuple:
        """Most urgent first: a holder stuck past its deadline, one whose worker may be lost, a failed task
        blocking the key, a pause; then the longest wait, the deepest queue."""
        marks = (self.overdue_stuck, self.unrenewed, self.blocked_by is not None, self.paused)
        group = marks.index(True) if True in marks else len(marks)
        return (group, -self.waited_seconds, -self.depth, self.key)


@dataclass(frozen=True)
class PoolState:
    """A pool as the live keys page shows it."""

    name: str
    running: int
    limit: int  # in force; 0: none
    waiting: int
    rate: str  # in force, said; "": none
    limit_override: int | None
    rate_override: str  # an operator's, said; "": none
    own_limit: int  # the settings' (or, for a pool they no longer name, its tasks' last); 0: none
    own_rate: str  # the same, said; "": none


def pool_states(gate: ConsoleGate) -> list[PoolState]:
    """Every pool the settings name or tasks used, by name: one round trip each (see ``pool_state``)."""
    configured = configured_pools()
    return [pool_state(gate, name, configured) for name in sorted(set(configured) | set(gate.pool_names()))]


def pool_state(gate: ConsoleGate, name: str, configured: dict[str, Pool] | None = None) -> PoolState:
    """A pool as the pages and commands tell it: its own limit and rate are the settings' (the gate keeps
    those its tasks last gave, for a pool the settings no longer name), an operator's over them."""
    pool = gate.inspect_pool(name, waiting_shown=0)
    own = (configured_pools() if configured is None else configured).get(name)
    own_limit = (own.limit if own else pool.task_limit) or 0
    own_interval_ms = (own.interval_ms if own else pool.task_interval_ms) or 0
    interval_ms = pool.interval_override_ms or own_interval_ms
    return PoolState(
        name, len(pool.running), pool.limit_override or own_limit, pool.waiting,
        rate_said(interval_ms) if interval_ms else "", pool.limit_override,
        rate_said(pool.interval_override_ms) if pool.interval_override_ms else "",
        own_limit, rate_said(own_interval_ms) if own_interval_ms else "",
    )  # fmt: skip


@dataclass
class LiveKeys:
    """The live keys page: the keys with work in the gate, and apart those whose rows alone say so."""

    states: list[KeyState] = field(default_factory=list)
    more: int = 0  # keys with work found but not shown
    read: int = 0  # keys of the deadline index read, the earliest-due first (none for a search)
    indexed: int = 0  # keys the deadline index holds (with work, or drained since the reaper last looked)
    lists_cut: bool = False  # a list of paused, blocked, overridden or overdue keys was read up to its limit
    unheld: list[UnheldKey] = field(default_factory=list)
    more_unheld: bool = False
    search: str | None = None
    pools: list[PoolState] = field(default_factory=list)  # every pool, by name (none for a search)
    searched_all: bool = True  # a search examined every name of the gate's lists
    matched: int = 0  # keys a search found in the gate's lists (with work or not)
    checked: int = 0  # keys checked in the gate (a search's: at most ``KEYS_READ`` of its matches)

    @property
    def unread(self) -> int:
        return max(self.indexed - self.read, 0)


def live_keys(*, limit: int = 100, search: str | None = None, read: int | None = None) -> LiveKeys:
    """The keys with work in the gate (a holder, tickets waiting), paused, blocked or given an operator's limit
    or rate, the most urgent first (``KeyState.urgency``); with ``search``, those the Key box's text finds
    (``KeyFragment``). Apart, the keys whose rows say unfinished while the gate holds nothing of them.

    Candidates come from the gate first: ``read`` (``KEYS_READ``) keys of the deadline index, the earliest-due
    first (a search instead examines about ``SEARCH_BUDGET`` names and takes ``read`` of its matches), and
    ``limit`` of each operator's list; then the keys of the oldest unfinished rows (``oldest_unfinished``),
    which tell the longest waits where the rows are right, and which the gate sorts into live and unheld.
    Bounded whatever the number of keys and rows: six commands a key checked (one a key of the rows'), a
    few round trips more; seven queries, each through an index.
    """
    gate, read = console_gate(), read or KEYS_READ
    fragment = KeyFragment(search) if search is not None else None
    if fragment is None:
        # The operator sees the latest submissions also while no worker runs; a request writes a bounded batch.
        submissions.write_page(gate)
        indexed = gate.indexed_keys(limit=read)
        paused, blocked = gate.paused_keys(limit=limit), gate.blocked_keys(limit=limit)
        overridden = gate.overridden_keys(limit=limit)
        overdue = gate.overdue_keys(stuck_after_seconds(), limit=limit)
        candidates = list(dict.fromkeys([*overdue, *blocked, *paused, *overridden, *indexed.keys]))
        cut = any(len(listed) == limit for listed in (paused, blocked, overridden, overdue))
        page = LiveKeys(read=len({*overdue, *indexed.keys}), indexed=indexed.total, lists_cut=cut)
        page.pools = pool_states(gate)
    else:
        matched = _matching(gate, fragment)
        candidates = matched.keys[:read]
        page = LiveKeys(search=search, searched_all=matched.complete, matched=len(matched.keys))
    page.checked = len(candidates)
    snapshots = _with_work(gate, candidates)
    rows = oldest_unfinished(
        passed=list(snapshots),
        matches=fragment.matches if fragment else None,
        also=fragment.exact_key if fragment else None,
    )
    held_nothing = gate.holding_nothing(list(rows.oldest)) if rows.oldest else set()
    snapshots.update(_with_work(gate, [k for k in rows.oldest if k not in held_nothing and k not in snapshots]))
    waits = _waits(gate, list(snapshots.values()))
    states = sorted((_state(s, waits.get(s.key)) for s in snapshots.values()), key=KeyState.urgency)
    page.more = max(len(states) - limit, 0)
    shown = gate.with_task_ids([snapshots[state.key] for state in states[:limit]])
    if fragment is not None and shown:
        submissions.write(gate, [s.key for s in shown])  # their rows, for the holders' links
    tasks = KeyedTask.objects.holding(shown)
    page.states = [_state(s, waits.get(s.key), tasks) for s in shown]
    page.unheld = unheld(rows, held_nothing, limit=UNHELD_SHOWN)
    page.more_unheld = rows.full or len(held_nothing) > UNHELD_SHOWN
    return page


def _with_work(gate: ConsoleGate, keys: list[str]) -> dict[str, KeySnapshot]:
    """Snapshots of those of ``keys`` the page lists (``_shown``), by key; one pipelined read."""
    return {s.key: s for s in gate.inspect_many(keys, waiting_shown=1, task_ids=False) if _shown(s)}


def _matching(gate: ConsoleGate, fragment: KeyFragment) -> MatchedKeys:
    """The keys of the gate's lists the fragment finds (its exact key first, also if unlisted)."""
    found = gate.keys_matching(fragment.glob, budget=SEARCH_BUDGET) if fragment.glob else MatchedKeys([], True)
    keys = [k for k in found.keys if fragment.matches(k)]
    exact = fragment.exact_key
    return MatchedKeys(list(dict.fromkeys([exact, *keys] if exact else keys)), found.complete)


def _shown(snapshot: KeySnapshot) -> bool:
    """Whether the page lists the key: it has work in the gate, is paused, or has an operator's limit or rate."""
    overridden = snapshot.limit_override is not None or snapshot.interval_override_ms is not None
    return bool(snapshot.holders or snapshot.depth or snapshot.paused or overridden)


def _unstarted(snapshot: KeySnapshot) -> int | None:
    """The key's oldest ticket waiting to start: a holder granted and never started, or its queue's head."""
    tickets = [t for t, h in snapshot.holders.items() if h.state == "granted" and h.attempts == 0]
    return min([*tickets, *snapshot.waiting[:1]], default=None)


def _waits(gate: ConsoleGate, snapshots: list[KeySnapshot]) -> dict[str, datetime]:
    """Since when each key's oldest ticket waiting to start waits: as the gate keeps it with the ticket until
    its row is written, else as its row says, else as its stored message says (its submission's stamp)."""
    oldest = {s.key: t for s in snapshots if (t := _unstarted(s)) is not None}
    pairs = list(oldest.items())
    kept = gate.kept_since(pairs)
    waits = {key: _moment(kept[key, t], per_second=1000) for key, t in pairs if (key, t) in kept}
    rows = KeyedTask.objects.waiting_since([p for p in pairs if p[0] not in waits])
    waits.update({key: rows[key, t] for key, t in pairs if key not in waits and (key, t) in rows})
    if unknown := [p for p in pairs if p[0] not in waits]:
        for (key, _), raw in zip(unknown, gate.stored_messages(unknown), strict=True):
            if (stamp := _submitted(raw)) is not None:
                waits[key] = stamp
    return {key: at for key, at in waits.items() if at is not None}


def _submitted(raw: bytes | None) -> datetime | None:
    """When a stored message's producer submitted it (its stamp), if it says and the app can decode it."""
    try:
        message = TaskMessage.decode(raw, current_app.conf.accept_content) if raw else None
    except MessageRefused:
        return None
    stamp = (message.options.get("headers") or {}).get(ENQUEUED_HEADER) if message else None
    return _moment(stamp) if isinstance(stamp, int | float) and not isinstance(stamp, bool) else None


def _moment(since_epoch: float, *, per_second: int = 1) -> datetime | None:
    """A time Redis keeps (since the epoch, ``per_second`` to a second), None if no datetime holds it: anyone
    may have written it."""
    try:
        return from_epoch(since_epoch / per_second)
    except (OverflowError, ValueError, OSError):
        return None


def _state(
    snapshot: KeySnapshot, oldest_wait: datetime | None, tasks: dict[tuple[str, int], KeyedTask] | None = None
) -> KeyState:
    k = snapshot.key
    holders = []
    for ticket, h in sorted(snapshot.holders.items()):
        task = (tasks or {}).get((k, ticket))
        waits = run_now.waits_for(task, snapshot) if task is not None and h.state == "granted" else ""
        unrenewed = unrenewed_said(h, task.worker if task else "") if may_be_lost(h) else ""
        holders.append(
            HolderRow(
                ticket, h.state, h.deadline_in, h.attempts, task, h.dispatch, h.task_id, h.stopping, waits, unrenewed
            )
        )
    return KeyState(
        k,
        snapshot.paused,
        snapshot.depth,
        oldest_wait,
        holders,
        is_stuck(snapshot),
        next((h for h in holders if h.ticket == snapshot.blocked), None),
        snapshot.paused_by,
        from_epoch(snapshot.paused_since),
        snapshot.limit_override,
        snapshot.interval_override_ms,
        overdue_too_long(snapshot),
        _unstarted(snapshot) is not None,
    )  # fmt: skip
