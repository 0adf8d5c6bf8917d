"""One builder per Lua script: the KEYS and ARGV of one call, in the order its header lists them.

A script's arguments are positional on the wire, so a builder is the one place that must stay
in step with its ``lua/<script>.lua`` header: the builder's parameters are the header's ARGV
names, in the header's order (``tests/gate/test_scripts.py`` checks it), and its KEYS list is
the header's KEYS. Change a header and its builder together. Builders only build: the gate's
runner (``base.GateBase._pipelined``) sends what they return.

On the wire a yes/no is 1 or 0, and an absent value is ''; a builder makes that encoding,
so that a caller passes ``bool`` and ``None``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

from redis.typing import EncodableT

from .keys import Index, KeyNames, PoolNames
from .results import Lease


class ScriptCall(NamedTuple):
    """One call of the script ``script`` (a name in ``scripts.SCRIPT_NAMES``)."""

    script: str
    keys: list[str]
    args: list[EncodableT]


def _flag(value: bool) -> int:
    return 1 if value else 0


def _or_empty(value: int | None) -> int | str:
    return "" if value is None else value


def submit(
    key: str,
    *,
    message: bytes,
    limit: int,
    dispatch_timeout_ms: int,
    lease_ms: int,
    join_id: str,
    idle_horizon_ms: int,
    max_lost: int,
    retried: bool,
    task_id: str,
    max_waiting: int,
    generation_ms: int,
    record: bytes,
    block: bool,
    wire: bytes,
    coalesce: str,
    debounce_ms: int,
) -> ScriptCall:
    n = KeyNames(key)
    return ScriptCall(
        "submit",
        [n.meta, n.queue, n.messages, n.holders, n.joined, n.recent, n.recent_older, n.unwritten, n.wires],
        [
            message, limit, dispatch_timeout_ms, lease_ms, join_id, idle_horizon_ms, max_lost,
            "1" if retried else "", task_id, max_waiting, generation_ms, record, _flag(block), wire, coalesce,
            debounce_ms,
        ],
    )  # fmt: skip


def start(
    key: str,
    *,
    ticket: int,
    dispatch: int,
    lease_ms: int,
    max_lost: int,
    task_id: str,
    block: bool,
    interval_ms: int,
    pool: str = "",
    pool_member: str = "",
    pool_limit: int = 0,
    pool_interval_ms: int = 0,
    pool_hold_ms: int = 0,
    dispatch_timeout_ms: int = 0,
) -> ScriptCall:
    """``pool``: asked in the same call (the keys' own server); its keys are sent then, and only then."""
    n = KeyNames(key)
    args: list[EncodableT] = [ticket, dispatch, lease_ms, max_lost, task_id, _flag(block), interval_ms]
    if not pool:
        return ScriptCall("start", [n.meta, n.holders, n.messages], args)
    pooled: list[EncodableT] = [pool, pool_member, pool_limit, pool_interval_ms, pool_hold_ms, dispatch_timeout_ms]
    return ScriptCall("start", [n.meta, n.holders, n.messages, *PoolNames(pool).all()], [*args, *pooled])


def wait_to_start(key: str, *, ticket: int, dispatch: int, interval_ms: int, lease_ms: int) -> ScriptCall:
    n = KeyNames(key)
    return ScriptCall("wait_to_start", [n.meta, n.holders, n.messages], [ticket, dispatch, interval_ms, lease_ms])


def finish(
    key: str,
    *,
    ticket: int,
    token: int,
    limit: int,
    dispatch_timeout_ms: int,
    idle_horizon_ms: int,
    task_id: str,
    record: bytes,
    block: bool,
    kept_ms: int,
    start_kept: str,
    pool: str = "",
    pool_member: str = "",
    pool_hold_ms: int = 0,
) -> ScriptCall:
    """``pool``: its slot given back in the same call (the keys' own server); its keys are sent then only."""
    n = KeyNames(key)
    keys = [n.meta, n.queue, n.messages, n.holders, n.outcomes, n.wires, n.unwritten]
    args: list[EncodableT] = [
        ticket, token, limit, dispatch_timeout_ms, idle_horizon_ms, task_id, record, _flag(block), kept_ms, start_kept,
    ]  # fmt: skip
    if not pool:
        return ScriptCall("finish", keys, args)
    return ScriptCall("finish", [*keys, *PoolNames(pool).all()], [*args, pool, pool_member, pool_hold_ms])


def retry(
    key: str, *, ticket: int, token: int, countdown_ms: int, dispatch_timeout_ms: int, message: bytes
) -> ScriptCall:
    n = KeyNames(key)
    return ScriptCall(
        "retry", [n.messages, n.holders, n.wires], [ticket, token, countdown_ms, dispatch_timeout_ms, message]
    )


def requeue(key: str, *, ticket: int, token: int, dispatch_timeout_ms: int, unstarted: bool) -> ScriptCall:
    return ScriptCall("requeue", [KeyNames(key).holders], [ticket, token, dispatch_timeout_ms, _flag(unstarted)])


def cancel(
    key: str,
    *,
    ticket: int,
    limit: int | None,
    dispatch_timeout_ms: int,
    idle_horizon_ms: int,
    forget: bool,
    failed: bool,
    dispatch: int | None,
    task_id: str,
    failed_for_good: bool,
) -> ScriptCall:
    n = KeyNames(key)
    return ScriptCall(
        "cancel",
        [n.meta, n.queue, n.messages, n.holders, n.recent, n.recent_older, n.unwritten, n.wires],
        [
            ticket, _or_empty(limit), dispatch_timeout_ms, idle_horizon_ms, _flag(forget), _flag(failed),
            _or_empty(dispatch), task_id, _flag(failed_for_good),
        ],
    )  # fmt: skip


def unblock(key: str, *, ticket: int, retry: bool, dispatch_timeout_ms: int, idle_horizon_ms: int) -> ScriptCall:
    n = KeyNames(key)
    return ScriptCall(
        "unblock",
        [n.meta, n.queue, n.messages, n.holders, n.wires],
        [ticket, _flag(retry), dispatch_timeout_ms, idle_horizon_ms],
    )


def override(key: str, *, limit: str, interval_ms: str, dispatch_timeout_ms: int, idle_horizon_ms: int) -> ScriptCall:
    n = KeyNames(key)
    return ScriptCall(
        "override",
        [n.meta, n.queue, n.messages, n.holders, n.wires],
        [limit, interval_ms, dispatch_timeout_ms, idle_horizon_ms],
    )


def newer_waiting(key: str, *, task_name: str, ticket: int) -> ScriptCall:
    n = KeyNames(key)
    return ScriptCall("newer_waiting", [n.meta, n.messages, n.holders], [task_name, ticket])


def stop(key: str, *, ticket: int, dispatch: int, by: str, how: str) -> ScriptCall:
    n = KeyNames(key)
    return ScriptCall("stop", [n.meta, n.holders], [ticket, dispatch, by, how])


def run_now(key: str, *, ticket: int, dispatch: int, dispatch_timeout_ms: int) -> ScriptCall:
    n = KeyNames(key)
    return ScriptCall("run_now", [n.meta, n.holders, n.messages, n.wires], [ticket, dispatch, dispatch_timeout_ms])


def renew(key: str, *, lease_ms: int, leases: Iterable[Lease]) -> ScriptCall:
    """``leases``: the key's own, sent as ticket, token pairs."""
    return ScriptCall(
        "renew", [KeyNames(key).holders], [lease_ms, *(v for lease in leases for v in (lease.ticket, lease.token))]
    )


def pause(key: str, *, pause: bool, dispatch_timeout_ms: int, idle_horizon_ms: int, paused_by: str) -> ScriptCall:
    n = KeyNames(key)
    return ScriptCall(
        "pause",
        [n.meta, n.queue, n.messages, n.holders, n.wires],
        [_flag(pause), dispatch_timeout_ms, idle_horizon_ms, paused_by],
    )


def refuse_join(key: str, *, join_id: str, due_in_ms: int, idle_horizon_ms: int) -> ScriptCall:
    return ScriptCall("refuse_join", [KeyNames(key).joined], [join_id, due_in_ms, idle_horizon_ms])


def claim_unwritten(shard: str, *, claim_ms: int, most_keys: int, ahead_ms: int) -> ScriptCall:
    """``shard``: one name of the unwritten index (see :class:`~.keys.Index`)."""
    return ScriptCall("claim_unwritten", [shard], [claim_ms, most_keys, ahead_ms])


def unwritten(key: str, *, count: int, keep_ms: int, min_age_ms: int = 0) -> ScriptCall:
    n = KeyNames(key)
    return ScriptCall("unwritten", [n.unwritten, n.messages, n.scan_cursors], [count, keep_ms, min_age_ms])


def replacement(key: str, *, task_id: str, ticket: int | None, max_hops: int) -> ScriptCall:
    n = KeyNames(key)
    return ScriptCall("replacement", [n.unwritten, n.recent, n.recent_older], [task_id, _or_empty(ticket), max_hops])


def reap(
    key: str,
    *,
    dispatch_timeout_ms: int,
    idle_horizon_ms: int,
    dry_run: bool,
    outcome_grace_ms: int,
    release: int | None = None,
    republish_before: int | None = None,
    released_dispatch: int | None = None,
) -> ScriptCall:
    n = KeyNames(key)
    return ScriptCall(
        "reap",
        [n.meta, n.queue, n.messages, n.holders, n.outcomes, n.scan_cursors, n.wires],
        [
            dispatch_timeout_ms, idle_horizon_ms, _flag(dry_run), outcome_grace_ms,
            _or_empty(release), _or_empty(republish_before), _or_empty(released_dispatch),
        ],
    )  # fmt: skip


def republish_soon(
    key: str, *, ticket: int, dispatch: int, delay_ms: int, undelivered_keep_ms: int | None = None, later: bool = False
) -> ScriptCall:
    """With ``undelivered_keep_ms``, the drop is counted (KEYS[2] and ARGV[4] are sent); else they are not.
    ``later``: the deadline is set also if it is later than the one it had."""
    n = KeyNames(key)
    if undelivered_keep_ms is None:
        return ScriptCall("republish_soon", [n.holders], [ticket, dispatch, delay_ms, "", _flag(later)])
    return ScriptCall("republish_soon", [n.holders, n.undelivered], [ticket, dispatch, delay_ms, undelivered_keep_ms])


def reindex(index: Index, *, moves: Iterable[tuple[str, float, int]]) -> list[ScriptCall]:
    """The calls moving each (key, score read, next score; -1 = remove) in ``index``: one per shard."""
    by_shard: dict[str, list[EncodableT]] = {}
    for key, seen, next_score in moves:
        # The score as Redis wrote it: a float index score read back whole prints without ".0".
        read = repr(seen) if seen != int(seen) else int(seen)
        by_shard.setdefault(index.shard_of(key), []).extend((key, read, next_score))
    return [ScriptCall("reindex", [shard], args) for shard, args in by_shard.items()]


def stage_rebuild(staged: Sequence[str], *, keep_ms: int, waiting: Iterable[tuple[int, bytes]]) -> ScriptCall:
    """``staged``: the rebuild's own queue and messages (:meth:`~.keys.KeyNames.staged`)."""
    return ScriptCall("stage_rebuild", list(staged), [keep_ms, *(v for pair in waiting for v in pair)])


def rebuild(key: str, staged: Sequence[str], *, last_ticket: int, limit: int, dispatch_timeout_ms: int) -> ScriptCall:
    n = KeyNames(key)
    return ScriptCall(
        "rebuild", [n.meta, n.queue, n.messages, n.holders, *staged, n.wires], [last_ticket, limit, dispatch_timeout_ms]
    )


def pool_acquire(
    pool: str,
    *,
    member: str,
    limit: int | None,
    interval_ms: int | None,
    hold_ms: int,
    starting: bool,
    grant_ms: int,
) -> ScriptCall:
    """``limit`` and ``interval_ms`` None: as the pool keeps them."""
    return ScriptCall(
        "pool_acquire",
        PoolNames(pool).all(),
        [member, _or_empty(limit), _or_empty(interval_ms), hold_ms, _flag(starting), grant_ms],
    )


def pool_release(pool: str, *, grant_ms: int, members: Iterable[str]) -> ScriptCall:
    return ScriptCall("pool_release", PoolNames(pool).all(), [grant_ms, *members])


def pool_renew(pool: str, *, hold_ms: int, members: Iterable[str]) -> ScriptCall:
    return ScriptCall("pool_renew", [PoolNames(pool).running], [hold_ms, *members])


def pool_wait(key: str, *, ticket: int, dispatch: int, pool: str, ask_again_ms: int) -> ScriptCall:
    n = KeyNames(key)
    return ScriptCall("pool_wait", [n.meta, n.holders], [ticket, dispatch, pool, ask_again_ms])


def pool_granted(key: str, *, ticket: int, dispatch_timeout_ms: int) -> ScriptCall:
    n = KeyNames(key)
    return ScriptCall("pool_granted", [n.meta, n.holders, n.messages, n.wires], [ticket, dispatch_timeout_ms])


def pool_override(pool: str, *, limit: str, interval_ms: str, grant_ms: int) -> ScriptCall:
    return ScriptCall("pool_override", PoolNames(pool).all(), [limit, interval_ms, grant_ms])
