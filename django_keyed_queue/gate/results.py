"""What the gate's operations return."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Literal

from .scripts import Code

#: What a holder is doing: ``running`` (started, its lease runs), ``granted`` (its message
#: is published and it has not started yet), or ``blocked`` (it failed for good and its task
#: blocks its key on failure: it keeps its slot until an operator retries or cancels it).
HolderState = Literal["running", "granted", "blocked", "waiting_for_pool"]


@dataclass(frozen=True)
class Grant:
    """A ticket the gate just granted: its message must now be published, unless the gate pushed it."""

    key: str
    ticket: int
    dispatch: int
    message: bytes
    #: The gate pushed its message onto the broker's queue as it granted it (see ``messaging/wire.py``).
    pushed: bool = False
    #: > 0: the call that granted it also started it for its caller (``Gate.finish``'s ``start_kept``):
    #: the run's fencing token, and its attempt number.
    token: int = 0
    attempts: int = 0


class QueueFull(Exception):
    """The key already has ``waiting`` tickets waiting, the most allowed; nothing was taken."""

    def __init__(self, key: str, waiting: int) -> None:
        super().__init__(f"key {key!r} has {waiting} tasks waiting")
        self.key, self.waiting = key, waiting


@dataclass(frozen=True)
class SubmitResult:
    ticket: int
    granted: bool
    #: Fencing token when the submission also started the ticket, else 0.
    token: int = 0
    #: Granted, and its message pushed onto the broker's queue by the same call.
    pushed: bool = False
    #: The waiting ticket of the same task this one replaced (coalescing), and its task id.
    superseded: tuple[int, str] | None = None


@dataclass(frozen=True)
class Unwritten:
    """A submission's record the gate keeps with its ticket until the row is written."""

    key: str
    ticket: int
    #: Granted at submission (its message was published then), else parked.
    granted: bool
    #: Server ms of the submission.
    at_ms: int
    #: As the producer gave it (opaque to the gate).
    record: bytes
    #: The ticket's stored message; None once it finished or was withdrawn.
    message: bytes | None
    #: A coalescing submission replaced it before it ran (``at_ms`` is then when): its record is
    #: the submission's with ``superseded_by`` and ``enqueued_ms`` added (see ``submit.lua``).
    superseded: bool = False
    #: The field of the key's unwritten hash it was read from, deleted once written ("" : the ticket).
    field: str = ""

    @classmethod
    def read(cls, key: str, field: bytes, kept: bytes, message: bytes | None) -> Unwritten:
        """A record of the key's unwritten hash, read back: ``kept`` is "<d (granted), w (waiting) or s
        (superseded)>|<server ms>|<record>", as submit.lua keeps it under the ticket, or under "<ticket>s"
        for a superseded one's (common.lua's supersede_record)."""
        parts = kept.split(b"|", 2)
        # Not as submit keeps it (someone else wrote it): handed on whole, for the caller to refuse.
        state, at_ms, record = parts if len(parts) == 3 and parts[1].isdigit() else (b"", b"0", kept)
        ticket = field[:-1] if field.endswith(b"s") else field
        if not ticket.isdigit():  # someone else's field: refused by the caller, then deleted as it is
            ticket, state, record = b"0", b"", b""
        return cls(key, int(ticket), state == b"d", int(at_ms), record, message, state == b"s", field=field.decode())


@dataclass(frozen=True)
class UnwrittenRecords:
    """A step of reading kept submission records (see ``Gate.unwritten``)."""

    records: list[Unwritten]
    #: Keys that keep records this step did not read: read them again once these are written.
    more: frozenset[str] = frozenset()
    #: Keys that keep records younger than the record delay, left unread, with when the oldest is due
    #: (server ms).
    later: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class StartResult:
    code: Code
    token: int = 0
    attempts: int = 0
    lease_deadline_ms: int = 0
    #: ``Code.TOO_EARLY``: seconds until the key's (or its pool's) rate lets it start, and its stored message.
    wait_seconds: float = 0.0
    message: bytes | None = None
    #: Tickets a slot its pool freed meanwhile went to (an expired one's): publish those not pushed.
    granted: list[Grant] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.code is Code.OK


@dataclass(frozen=True)
class KeptStart:
    """``Gate.finish``'s grant kept for its caller is started in the same call if its message is of
    ``task_name``, with that task's policy (as ``Gate.start``'s arguments of the same names)."""

    task_name: str
    max_lost: int
    block: bool = False


@dataclass(frozen=True)
class FinishResult:
    code: Code
    granted: list[Grant] = field(default_factory=list)
    #: The finished ticket's submission record, with its stored message, while its row is not written:
    #: the caller writes the row once, in its final state (``Gate.forget_outcomes`` then deletes it).
    unwritten: Unwritten | None = None

    @property
    def ok(self) -> bool:
        return self.code is Code.OK


@dataclass(frozen=True)
class Outcome:
    """A finished run's record, kept with its key by ``finish`` until written (opaque to the gate).

    The reaper hands back one left too long as a ``Recovery`` with action ``outcome``.
    """

    task_id: str
    record: bytes


@dataclass(frozen=True)
class Lease:
    """A running ticket as its worker process knows it."""

    key: str
    ticket: int
    token: int


class RecoveryAction(enum.StrEnum):
    """What the reaper does to a ticket (a ``str``: each member equals, and prints as, its value)."""

    #: Its lease expired (its worker died or stalled): publish it again, with the next dispatch.
    REDISPATCH = "redispatch"
    #: Granted but never started (its message was lost): publish it again, same dispatch.
    REPUBLISH = "republish"
    #: It lost too many leases: it failed and gave up its slot.
    FAIL = "fail"
    #: A parked ticket took a freed slot: publish it.
    GRANT = "grant"
    #: A finished run whose worker died before writing its record: write it.
    OUTCOME = "outcome"
    #: It lost too many leases, and its task blocks its key on failure: it failed and keeps its slot.
    BLOCK = "block"
    #: It waited for its pool at its deadline: its pool is asked again (``message`` names the pool).
    POOL = "pool"


@dataclass(frozen=True)
class Stopping:
    """Who stopped a run (an operator, or Celery killing its process on purpose), when and how
    (``Gate.stop``): it holds its key's slot until it has ended."""

    #: The operator who stopped it; empty when Celery killed it and nobody stopped it first.
    by: str
    #: When, in server ms since the epoch.
    since_ms: int
    #: What was done to its process ("SIGTERM"), or why Celery killed it.
    how: str


@dataclass(frozen=True)
class Recovery:
    """One thing the reaper did (or, in a dry run, would do) to a ticket.

    ``action`` is ``redispatch`` (its lease expired: publish it again),
    ``republish`` (granted but never started: publish it again), ``fail``
    (lost too many leases: it gave up its slot), ``grant`` (a parked
    ticket took a freed slot: publish it) or ``outcome`` (``message`` is the
    unwritten record of a finished run whose worker died).
    """

    key: str
    action: RecoveryAction
    ticket: int
    dispatch: int
    attempts: int
    message: bytes | None
    #: The gate pushed its message onto the broker's queue as it recovered it.
    pushed: bool = False
    #: A stopped run's end (it failed, or blocks its key): who stopped it.
    stopped: Stopping | None = None

    @property
    def publishes(self) -> bool:
        return self.action in (RecoveryAction.REDISPATCH, RecoveryAction.REPUBLISH, RecoveryAction.GRANT)


@dataclass(frozen=True)
class Holder:
    """A ticket holding one of its key's slots, as :meth:`Gate.inspect` read it."""

    state: HolderState
    #: Generation of the message allowed to start it: 1, then one more per retry or recovery.
    dispatch: int
    #: Fencing token of the running attempt; 0 while granted.
    token: int
    #: How many times the ticket has started.
    attempts: int
    #: How many of its leases expired (its worker died or stalled).
    lost: int
    #: How many lost leases are dispatched again; the next one fails the ticket.
    max_lost: int
    #: Its task blocks its key when it fails for good (``on_failure="block"``).
    blocks_on_failure: bool
    #: Seconds until the reaper may act (its lease end when running, its dispatch timeout when
    #: granted); negative once overdue; meaningless when blocked (the reaper leaves it).
    deadline_in: float
    #: The task id of the message stored with the ticket: what names the run (a key's tickets start
    #: over once it drains, so a ticket alone may match older records). None if the message is gone.
    task_id: str | None = None
    #: A running holder being stopped: it keeps its slot until its run has ended.
    stopping: Stopping | None = None
    #: A granted holder an operator ran now: this dispatch starts whatever its key's rate.
    run_now: bool = False


@dataclass(frozen=True)
class RestoredAhead:
    """What :meth:`Gate.restore_ahead` did to a live key: the restored tasks' new tickets, in the order given,
    and the tickets that waited numbered again after them (old -> new)."""

    code: Code
    tickets: list[int] = field(default_factory=list)
    renumbered: dict[int, int] = field(default_factory=dict)
    granted: list[Grant] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.code is Code.OK


@dataclass(frozen=True)
class Overridden:
    """What setting a key's overrides changed (``Gate.set_overrides``)."""

    #: Tickets a raised limit granted: publish those not pushed.
    granted: list[Grant]
    #: Tickets a lowered limit took back, never started: they wait again, with their task ids.
    withdrawn: list[tuple[int, str | None]] = field(default_factory=list)


@dataclass(frozen=True)
class KeySnapshot:
    """One key's state in the gate, as :meth:`Gate.inspect` read it (one round trip, not atomic)."""

    key: str
    #: The last ticket taken (0: none yet, or the key expired idle).
    last_ticket: int
    #: The last fencing token given (0: none in this epoch of the key).
    last_token: int
    paused: bool
    #: When the key was paused (seconds since the epoch, Redis' clock), if it is and that was kept.
    paused_since: float | None
    #: Who paused it, as the pause said ("" if it did not).
    paused_by: str
    #: Seconds since a task of the key last started (kept for a key with a ``rate``), else None.
    since_last_start: float | None
    #: A ticket that failed and blocks the key (``on_failure="block"``), else None; a key of limit 2 or
    #: more may have others (see :meth:`blocks`).
    blocked: int | None
    #: The oldest waiting tickets, as many as were asked for.
    waiting: list[int]
    #: How many tickets wait, shown or not.
    depth: int
    #: The tickets holding a slot (at most the key's limit), by ticket.
    holders: dict[int, Holder]
    #: How many tickets have a stored message (waiting, granted or running).
    messages: int
    #: Seconds until the idle key's counters expire; None while the key has work (or no state).
    idle_expires_in: float | None
    #: An operator's limit for the key, over its tasks' own (``Gate.set_overrides``), else None.
    limit_override: int | None = None
    #: An operator's least ms between two starts of the key, over its tasks' rate, else None.
    interval_override_ms: int | None = None

    def blocks(self, ticket: int, task_id: str | None = None) -> bool:
        """Whether ``ticket`` (of task ``task_id``, if given) failed for good and keeps its slot, blocking the key."""
        holder = self.held_by(ticket, task_id)
        return holder is not None and holder.state == "blocked"

    def held_by(self, ticket: int | None, task_id: str | None = None) -> Holder | None:
        """The slot ``ticket`` holds, if any; with ``task_id``, only if that task's message holds it (an
        older record of the key may have the same ticket number)."""
        holder = self.holders.get(ticket) if ticket is not None else None
        if holder is None or (task_id is not None and holder.task_id != task_id):
            return None
        return holder
