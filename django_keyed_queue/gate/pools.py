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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.cluster import RedisCluster
from redis.typing import EncodableT

from .base import GateBase, scored, text, texts
from .calls import ScriptCall, flag, or_empty
from .keys import POOLS, KeyNames, PoolNames, member_ticket, pool_member
from .override import UNCHANGED, Unchanged, override_value
from .results import Grant, Lease, Recovery, RecoveryAction
from .scripts import Code, ms_to_seconds

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
    """A pool as :meth:`PoolCalls.inspect_pool` read it."""

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
    #: the slot is the ticket's all the same (``PoolCalls.pool_granted``), not the message's.
    given: bool = False

    @property
    def ok(self) -> bool:
        return self.code is Code.OK


class PoolCalls(GateBase):
    """A pooled ticket's slot of its pool: asked for at its start, renewed, given back, and the line served."""

    def pool_acquire(self, pool: Pool, key: str, ticket: int, *, starting: bool = True) -> PoolAcquired:
        """Ask ``pool`` for a slot for ``ticket`` of ``key``: OK (it holds one, and ``starting``, may start
        now), PARKED (it waits in the pool's line), or TOO_EARLY (the pool's rate: it holds its slot, and
        may start in ``wait_seconds``). ``starting``: a worker starts it now (its start counts for the rate,
        and the slot is held a lease); else the slot is held for its start, a dispatch timeout.

        One round trip, and one more per other ticket the pool gave a freed slot to."""
        call = pool_acquire_call(
            pool.name, member=pool_member(key, ticket), limit=pool.limit, interval_ms=pool.interval_ms,
            hold_ms=self.running_hold_ms if starting else self.dispatch_timeout_ms, starting=starting,
            grant_ms=self.dispatch_timeout_ms,
        )  # fmt: skip
        code, wait_ms, given, *others = self._pipelined([call], also=[("SADD", POOLS, pool.name)])[0]
        granted = self.pool_granted(pool.name, others)
        result = PoolAcquired(Code(code), ms_to_seconds(int(wait_ms)), granted, given=bool(int(given)))
        logger.debug("pool_acquire pool=%r key=%r ticket=%s: %s", pool.name, key, ticket, result.code.name)
        return result

    @property
    def pools_apart(self) -> bool:
        """A pool's slot is on another server than its tickets' keys (a Redis Cluster): it is asked in calls of
        its own. On one server, ``start`` and ``finish`` ask and give back in their own call."""
        return isinstance(self.client, RedisCluster)

    def pool_grants(self, flat: Sequence[Any]) -> list[Grant]:
        """Grants from a script's key, ticket, dispatch, message, pushed quintuples (``pool_here.lua``'s)."""
        return [
            Grant(
                text(flat[i]), int(flat[i + 1]), int(flat[i + 2]), flat[i + 3], pushed=self.pushes.pushed(flat[i + 4])
            )
            for i in range(0, len(flat), 5)
        ]

    @property
    def running_hold_ms(self) -> int:
        """How long a running ticket holds its pool slot from a start or a renew: its lease, and a margin."""
        return self.lease_ms + min(HOLD_MARGIN_MS, self.lease_ms)

    def pool_wait(self, key: str, ticket: int, dispatch: int, *, pool: str) -> bool:
        """The pool had no slot for ``ticket``, granted with ``dispatch``: it waits for its pool (no message of it
        starts until the pool gives it a slot). False if it moved on meanwhile (the pool gave it one already,
        and its key published it again; or it ended)."""
        call = pool_wait_call(key, ticket=ticket, dispatch=dispatch, pool=pool, ask_again_ms=self.dispatch_timeout_ms)
        code, _ = self._pipelined([call], index=key, index_within_ms=self.dispatch_timeout_ms)[0]
        return Code(code) is Code.OK

    def pool_release(self, pool: str, tickets: Iterable[tuple[str, int]] = ()) -> list[Grant]:
        """Give back the pool slots of ``tickets`` ((key, ticket) pairs: their runs ended, or they no longer
        wait), and the expired ones; the oldest waiting tickets take the free slots. Returns their grants:
        publish those not pushed. One round trip, and one more if any ticket took a slot."""
        members = [pool_member(key, ticket) for key, ticket in tickets]
        call = pool_release_call(pool, grant_ms=self.dispatch_timeout_ms, members=members)
        return self.pool_granted(pool, self._pipelined([call])[0])

    def pool_renew(self, pool: str, leases: Iterable[Lease]) -> dict[Lease, bool]:
        """Hold the pool slots of running ``leases`` another lease; False for one whose slot went back."""
        held = list(leases)
        if not held:
            return {}
        members = [pool_member(h.key, h.ticket) for h in held]
        call = pool_renew_call(pool, hold_ms=self.running_hold_ms, members=members)
        return {lease: bool(ok) for lease, ok in zip(held, self._pipelined([call])[0], strict=True)}

    def pool_granted(self, pool: str, members: Sequence[bytes | str]) -> list[Grant]:
        """The keys of ``members``, to whom ``pool`` just gave slots, publish them again; a member whose
        ticket no longer holds its key's slot gives its pool slot back, and the next takes it."""
        grants: list[Grant] = []
        while members:
            tickets = [member_ticket(text(m)) for m in members]
            batch = [pool_granted_call(k, ticket=t, dispatch_timeout_ms=self.dispatch_timeout_ms) for k, t in tickets]
            gone: list[tuple[str, int]] = []
            for (key, ticket), (code, dispatch, message, pushed) in zip(tickets, self._pipelined(batch), strict=True):
                if code == Code.OK:
                    grants.append(Grant(key, ticket, int(dispatch), message, pushed=self.pushes.pushed(pushed)))
                elif code == Code.NOT_GRANTED:
                    gone.append((key, ticket))
            if not gone:
                break
            members = self._pipelined(
                [pool_release_call(pool, grant_ms=self.dispatch_timeout_ms, members=[pool_member(*g) for g in gone])]
            )[0]
        return grants

    def pool_names(self) -> list[str]:
        """Every pool tasks have used, by name."""
        return sorted(text(p) for p in self.client.smembers(POOLS))

    def inspect_pool(self, pool: str, *, waiting_shown: int = 20) -> PoolSnapshot:
        """What ``pool`` holds now: its limit and rate, who runs and who waits (two round trips)."""
        names = PoolNames(pool)
        now_ms = self._server_time_ms()
        running, waiting, first, meta = self._run(
            [
                ("ZRANGE", names.running, 0, -1, "WITHSCORES"),
                ("ZCARD", names.ready),
                ("ZRANGE", names.ready, 0, waiting_shown - 1),
                ("HGETALL", names.meta),
            ]
        )
        fields = texts(meta)

        def number(name: str) -> int | None:  # anyone may have written it
            value = fields.get(name, "")
            return int(value) if value.isascii() and value.isdigit() else None

        last = number("last_start")
        return PoolSnapshot(
            name=pool,
            task_limit=number("limit"),
            task_interval_ms=number("interval"),
            limit_override=number("limit_override"),
            interval_override_ms=number("interval_override"),
            running=[
                (*member_ticket(text(m)), ms_to_seconds(int(float(score)) - now_ms)) for m, score in scored(running)
            ],
            waiting=int(waiting),
            waiting_first=[member_ticket(text(m)) for m in first],
            last_start_ago=ms_to_seconds(now_ms - last) if last else None,
        )

    def set_pool_overrides(
        self, pool: str, *, limit: int | None | Unchanged = UNCHANGED, interval_ms: int | None | Unchanged = UNCHANGED
    ) -> list[Grant]:
        """Give ``pool`` an operator's ``limit`` and rate (``interval_ms``) over its tasks' own, or None to go
        back to them; ``UNCHANGED`` leaves one as it is. A raised limit gives free slots to waiting tickets at
        once (their grants are returned, to publish); a lowered one stops no run. Setting the same again
        changes nothing."""
        call = pool_override_call(
            pool,
            limit=override_value(limit),
            interval_ms=override_value(interval_ms),
            grant_ms=self.dispatch_timeout_ms,
        )
        members = self._pipelined([call], also=[("SADD", POOLS, pool)])[0]
        logger.debug("overrides of pool=%r: limit=%s interval_ms=%s", pool, limit, interval_ms)
        return self.pool_granted(pool, members)

    def reap_pools(self) -> list[Recovery]:
        """Return every pool's expired slots; the oldest waiting tickets take them (the reaper's pass, for a
        pool no call came to). Their grants, as the reaper's recoveries. One round trip a pool, and one more
        for each that gave a slot."""
        recoveries: list[Recovery] = []
        for pool in self.pool_names():
            recoveries += [_granted(g) for g in self.pool_release(pool)]
        return recoveries

    def ask_pools_again(self, waiting: Sequence[Recovery]) -> list[Recovery]:
        """The reaper's ``pool`` recoveries (tickets that still waited for their pool at their deadline): each
        pool is asked again, as if the answer it gave was lost; a ticket given a slot is published again (a
        ``grant``), the others wait on (their deadline was moved)."""
        recoveries: list[Recovery] = []
        for r in waiting:
            pool = text(r.message or b"")
            if not pool:
                recoveries.append(r)
                continue
            acquired = self.pool_acquire(Pool(pool), r.key, r.ticket, starting=False)
            granted = acquired.granted
            if acquired.code is Code.OK:
                granted += self.pool_granted(pool, [pool_member(r.key, r.ticket)])
            recoveries += [_granted(g) for g in granted]
            if not any((g.key, g.ticket) == (r.key, r.ticket) for g in granted):
                recoveries.append(r)  # it waits on (a slot freed meanwhile may have gone to it through another)
        return recoveries


def _granted(grant: Grant) -> Recovery:
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
