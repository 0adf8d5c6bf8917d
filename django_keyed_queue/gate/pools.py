"""Pools: a limit shared by every key and worker (at most ``limit`` of a pool's tasks run at once,
at most one starts per ``interval``), kept in Redis beside the keys.

A pooled ticket needs its key's slot, as any ticket, and then a slot of its pool. Its key grants it
and its message is published as usual; at its start the worker asks the pool (``pool_acquire``)
before its key (``start``):

- the pool has a slot for it: it starts, and renews the slot with its lease;
- the pool has none: the ticket joins the pool's line (first come, first served, whatever the
  key), its key marks it waiting for its pool (``pool_wait``: no message of it may start), and the
  worker drops the message: it holds no worker process and no prefetch slot while it waits;
- the pool's rate lets it start only later: its message goes out again for then, as a key's rate.

When a run ends its slot goes back (``pool_release``) and the oldest waiting ticket takes it at
once; its key publishes it again with its next dispatch (``pool_granted``).

The pool's state lives in its own slot, so each script touches one slot and pools run unchanged on a
Redis Cluster. No step rests on the one after it for the limit: a ticket starts only while its pool
says it holds a slot, and a slot is held only until its deadline, which its run renews with its
lease, so a slot whose worker died, or whose release was lost, returns by its lease's end. A lost
``pool_granted`` (the process died between the two calls) is mended by the reaper, which asks the
pool again for a ticket still waiting at its deadline; the pool's expired slots are returned by
the reaper's pass too, should no call of the pool come.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from redis.typing import EncodableT

from .calls import ScriptCall, flag, or_empty
from .keys import KeyNames, PoolNames
from .results import Grant, Recovery, RecoveryAction
from .scripts import Code

logger = logging.getLogger(__name__)

#: How much longer than its run's lease a running ticket holds its pool slot: the gate never shows a
#: run whose lease has not ended without its slot (on a cluster the pool's clock is another server's).
HOLD_MARGIN_MS = 1000


@dataclass(frozen=True)
class Pool:
    """A pool as its tasks give it: its name, its limit (0 = none) and least ms between two starts (0 = none).
    None for both: as the pool keeps them (the reaper's asks, which know no task)."""

    name: str
    limit: int | None = None
    interval_ms: int | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a pool's name must not be empty")
        if (self.limit is None) != (self.interval_ms is None):
            raise ValueError(f"pool {self.name!r}: give both its limit and its interval, or neither")
        if (self.limit or 0) < 0 or (self.interval_ms or 0) < 0:
            raise ValueError(f"pool {self.name!r}: its limit and interval must not be negative")


@dataclass(frozen=True)
class PoolSnapshot:
    """A pool as :meth:`Gate.inspect_pool` read it."""

    name: str
    #: What its tasks give (kept by their last ask), and an operator's overrides; None: none given.
    task_limit: int | None
    task_interval_ms: int | None
    limit_override: int | None
    interval_override_ms: int | None
    #: (key, ticket, seconds its slot is held for) of each ticket holding a slot, longest held first.
    running: list[tuple[str, int, float]]
    #: How many tickets wait for a slot, and the first of them (key, ticket), first come first.
    waiting: int
    waiting_first: list[tuple[str, int]]
    #: Seconds since the pool's last start counted for its rate; None: none.
    last_start_ago: float | None

    @property
    def limit(self) -> int:
        """The limit in force (0: none)."""
        return self.limit_override or self.task_limit or 0

    @property
    def interval_ms(self) -> int:
        """The least ms between two starts in force (0: no rate)."""
        return self.interval_override_ms or self.task_interval_ms or 0


@dataclass(frozen=True)
class PoolAcquired:
    """What a pool said to a ticket that asked it for a slot."""

    code: Code
    #: TOO_EARLY: seconds until the pool's rate lets it start (it holds its slot until then).
    wait_seconds: float = 0.0
    #: Other tickets the pool gave a slot meanwhile (an expired one's), their keys told: publish those not pushed.
    granted: list[Grant] = field(default_factory=list)
    #: The slot it holds was given by this ask (it held none before): if its key refuses the message that asked,
    #: the slot is the ticket's all the same (``Gate.pool_granted``), not the message's.
    given: bool = False

    @property
    def ok(self) -> bool:
        return self.code is Code.OK


def granted_recovery(grant: Grant) -> Recovery:
    return Recovery(
        grant.key, RecoveryAction.GRANT, grant.ticket, grant.dispatch, 0, grant.message, pushed=grant.pushed
    )


def pool_acquire_call(
    pool: str, *, member: str, limit: int | None, interval_ms: int | None, hold_ms: int, starting: bool, grant_ms: int
) -> ScriptCall:
    """``pool_acquire.lua``'s call; ``limit`` and ``interval_ms`` None: as the pool keeps them."""
    argv: list[EncodableT] = [member, or_empty(limit), or_empty(interval_ms), hold_ms, flag(starting), grant_ms]
    return ScriptCall("pool_acquire", PoolNames(pool).all(), argv)


def pool_release_call(pool: str, *, grant_ms: int, members: Iterable[str]) -> ScriptCall:
    return ScriptCall("pool_release", PoolNames(pool).all(), [grant_ms, *members])


def pool_renew_call(pool: str, *, hold_ms: int, members: Iterable[str]) -> ScriptCall:
    return ScriptCall("pool_renew", [PoolNames(pool).running], [hold_ms, *members])


def pool_wait_call(key: str, *, ticket: int, dispatch: int, pool: str, ask_again_ms: int) -> ScriptCall:
    n = KeyNames(key)
    return ScriptCall("pool_wait", [n.meta, n.holders], [ticket, dispatch, pool, ask_again_ms])


def pool_granted_call(key: str, *, ticket: int, dispatch_timeout_ms: int) -> ScriptCall:
    n = KeyNames(key)
    return ScriptCall("pool_granted", [n.meta, n.holders, n.messages, n.wires], [ticket, dispatch_timeout_ms])


def pool_override_call(pool: str, *, limit: str, interval_ms: str, grant_ms: int) -> ScriptCall:
    return ScriptCall("pool_override", PoolNames(pool).all(), [limit, interval_ms, grant_ms])
