"""Finish: end a running ticket and grant the next ones, beside ``lua/finish.lua``.

A ``Finish`` is built once, by the worker whose run ended, and passed unchanged to
``Gate.finish``; ``call`` makes its script call and ``parse`` reads the reply. ``ARGV`` names the
script's arguments in its header's order (``tests/gate/test_scripts.py`` checks the two agree).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from .base import grants
from .calls import ScriptCall, flag
from .keys import KeyNames, PoolNames, pool_member
from .results import FinishResult, Grant, KeptStart, Outcome, Unwritten
from .scripts import Code, seconds_to_ms

if TYPE_CHECKING:
    from .gate import Gate

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Finish:
    """The end of the run that holds ``ticket`` of ``key`` with fencing ``token``."""

    key: str
    ticket: int
    token: int
    limit: int = 1
    #: Kept with the key until ``Gate.forget_outcomes``; the reaper hands back outcomes left too long.
    outcome: Outcome | None = None
    #: The run failed for good and its task blocks its key on failure: the ticket keeps its slot and the
    #: key is blocked (``Code.BLOCKED``) until ``Gate.unblock``, listed among the blocked keys in the same trip.
    block: bool = False
    #: > 0: the caller keeps the first grant to run it itself (a worker's local handoff): it is not
    #: pushed, and the reaper publishes it if it has not started within that long.
    keep_first_seconds: float = 0.0
    #: With ``keep_first_seconds``: a kept grant of that task is started for the caller in the same call
    #: (``Grant.token``); its lease runs from now, and the reaper recovers it as any lost run.
    start_kept: KeptStart | None = None
    #: The run's pool: its slot goes back (also when it blocks its key), in the same call on one server, in
    #: one more on a Redis Cluster; the tickets the slot goes to are among the grants, after the key's.
    pool: str | None = None


#: finish.lua's ARGV, in its header's order (the last three only when its pool is asked in the same call).
ARGV = (
    "ticket", "token", "limit", "dispatch_timeout_ms", "idle_horizon_ms", "task_id", "record", "block", "kept_ms",
    "start_kept", "pool", "pool_member", "pool_hold_ms",
)  # fmt: skip


def call(finish: Finish, gate: Gate, *, pool_here: bool) -> ScriptCall:
    """``finish.lua``'s call of ``finish`` with ``gate``'s durations; ``pool_here``: its pool's slot is given
    back in the same call (the pool's keys are on the key's server)."""
    f, outcome, kept = finish, finish.outcome, finish.start_kept
    start_kept = ""
    if kept is not None and f.keep_first_seconds > 0:
        start_kept = f"{gate.lease_ms}|{kept.max_lost}|{int(kept.block)}|{kept.task_name}"
    argv: dict[str, Any] = {
        "ticket": f.ticket, "token": f.token, "limit": f.limit, "dispatch_timeout_ms": gate.dispatch_timeout_ms,
        "idle_horizon_ms": gate.idle_horizon_ms, "task_id": outcome.task_id if outcome else "",
        "record": outcome.record if outcome else b"", "block": flag(f.block),
        "kept_ms": seconds_to_ms(f.keep_first_seconds),
        "start_kept": start_kept,
    }  # fmt: skip
    n = KeyNames(f.key)
    keys = [n.meta, n.queue, n.messages, n.holders, n.outcomes, n.wires, n.unwritten]
    if not (pool_here and f.pool):
        return ScriptCall("finish", keys, [argv[name] for name in ARGV[:10]])
    argv.update(pool=f.pool, pool_member=pool_member(f.key, f.ticket), pool_hold_ms=gate.running_hold_ms)
    return ScriptCall("finish", [*keys, *PoolNames(f.pool).all()], [argv[name] for name in ARGV])


def parse(
    finish: Finish, reply: list[Any], read_pushed: Callable[[Any], bool], pool_grants: Callable[[Any], list[Grant]]
) -> FinishResult:
    """The result of ``finish``'s reply. ``pool_grants`` gives the tickets its pool's freed slot went to, from
    the reply's field of them (empty where the pool was not asked in the same call)."""
    granted = grants(finish.key, reply[6:], read_pushed)
    if granted and int(reply[1]):
        granted[0] = replace(granted[0], token=int(reply[1]), attempts=int(reply[2]))
    kept, message = (reply[3], reply[4]) if len(reply) > 3 else (b"", b"")
    unwritten = Unwritten.read(finish.key, str(finish.ticket).encode(), kept, message or None) if kept else None
    if finish.pool is not None and reply[0] in (Code.OK, Code.BLOCKED):
        granted += pool_grants(reply[5] if len(reply) > 5 else [])
    result = FinishResult(Code(reply[0]), granted, unwritten)
    tickets = [g.ticket for g in granted]
    logger.debug("finish key=%r ticket=%s code=%s granted=%s", finish.key, finish.ticket, result.code.name, tickets)
    return result
