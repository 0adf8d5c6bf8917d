"""Start: check a message may run its ticket and start its lease, beside ``lua/start.lua``.

A ``Start`` is built once, by the worker about to run a message, and passed unchanged to
``Gate.start`` (and, on a Redis Cluster where a pool is asked apart, to ``Gate.start_after_pool``);
``call`` makes its script call and ``parse`` reads the reply. ``ARGV`` names the script's
arguments in its header's order (``tests/gate/test_scripts.py`` checks the two agree).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .calls import ScriptCall, flag
from .keys import KeyNames, PoolNames, pool_member
from .results import Grant, StartResult
from .scripts import Code, ms_to_seconds

if TYPE_CHECKING:
    from .gate import Gate
    from .pools import Pool

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Start:
    """The start of ``ticket`` of ``key`` by the message of dispatch ``dispatch``."""

    key: str
    ticket: int
    dispatch: int
    #: The reaper re-dispatches the ticket that many times if its lease expires; the next time it fails
    #: the ticket and frees its slot (the task's policy).
    max_lost: int = 0
    #: A failure for good keeps the slot instead, and the key grants nothing until ``Gate.unblock``.
    block: bool = False
    #: The message must be the ticket's own: the one stored with it has this task id
    #: (``Code.FOREIGN_MESSAGE`` if not); '' = not checked.
    task_id: str = ""
    #: The key's starts are at least that far apart: one sooner is ``Code.TOO_EARLY``, with the wait and
    #: the ticket's stored message (to send again for then).
    interval_ms: int = 0
    #: The ticket also needs a slot of that pool (``pools.py``): without one it waits for its pool
    #: (``Code.PARKED``), and the pool's rate may make it ``Code.TOO_EARLY`` as a key's does.
    pool: Pool | None = None


#: start.lua's ARGV, in its header's order (the last six only when its pool is asked in the same call).
ARGV = (
    "ticket", "dispatch", "lease_ms", "max_lost", "task_id", "block", "interval_ms", "pool", "pool_member",
    "pool_limit", "pool_interval_ms", "pool_hold_ms", "dispatch_timeout_ms",
)  # fmt: skip


def call(start: Start, gate: Gate, *, pool_here: bool) -> ScriptCall:
    """``start.lua``'s call of ``start`` with ``gate``'s durations; ``pool_here``: its pool is asked in the
    same call (the pool's keys are on the key's server)."""
    s = start
    argv: dict[str, Any] = {
        "ticket": s.ticket, "dispatch": s.dispatch, "lease_ms": gate.lease_ms, "max_lost": s.max_lost,
        "task_id": s.task_id, "block": flag(s.block), "interval_ms": s.interval_ms,
    }  # fmt: skip
    n = KeyNames(s.key)
    keys = [n.meta, n.holders, n.messages]
    if not (pool_here and s.pool is not None):
        return ScriptCall("start", keys, [argv[name] for name in ARGV[:7]])
    pool = s.pool
    argv.update(
        pool=pool.name, pool_member=pool_member(s.key, s.ticket), pool_limit=pool.limit or 0,
        pool_interval_ms=pool.interval_ms or 0, pool_hold_ms=gate.running_hold_ms,
        dispatch_timeout_ms=gate.dispatch_timeout_ms,
    )  # fmt: skip
    return ScriptCall("start", [*keys, *PoolNames(pool.name).all()], [argv[name] for name in ARGV])


def parse(start: Start, reply: list[Any], pool_grants: Callable[[Any], list[Grant]]) -> StartResult:
    """The result of ``start``'s reply; ``pool_grants`` reads the tickets a slot its pool freed meanwhile
    went to (an expired one's), from the reply's field of them."""
    # A refusal of the key's (no slot, another dispatch ...) is the first four fields alone.
    code, token, attempts, deadline, *rest = reply
    message, pooled = (rest[0], rest[1]) if rest else (None, [])
    granted = pool_grants(pooled)
    if code == Code.TOO_EARLY:
        return StartResult(
            Code(code), attempts=int(attempts), wait_seconds=ms_to_seconds(deadline), message=message,
            granted=granted,
        )  # fmt: skip
    result = StartResult(Code(code), int(token), int(attempts), int(deadline), granted=granted)
    logger.debug("start key=%r ticket=%s code=%s", start.key, start.ticket, result.code.name)
    return result
