"""What the gate's operations return."""

from __future__ import annotations

from dataclasses import dataclass, field

from .scripts import Code


@dataclass(frozen=True)
class Grant:
    """A ticket the gate just granted: its message must now be published."""

    key: str
    ticket: int
    dispatch: int
    message: bytes


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


@dataclass(frozen=True)
class StartResult:
    code: Code
    token: int = 0
    attempts: int = 0
    lease_deadline_ms: int = 0

    @property
    def ok(self) -> bool:
        return self.code is Code.OK


@dataclass(frozen=True)
class FinishResult:
    code: Code
    granted: list[Grant] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.code is Code.OK


@dataclass(frozen=True)
class Lease:
    """A running ticket as its worker process knows it."""

    key: str
    ticket: int
    token: int


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
    action: str
    ticket: int
    dispatch: int
    attempts: int
    message: bytes | None

    @property
    def publishes(self) -> bool:
        return self.action in ("redispatch", "republish", "grant")
