"""One builder per Lua script not yet in a transition's module: the KEYS and ARGV of one call.

A transition's module beside its script (``submit.py`` beside ``lua/submit.lua``) names the script's
arguments in its ``ARGV``, in its header's order, and builds its call from them (``call``) and reads
its reply (``parse``); ``tests/gate/test_scripts.py`` checks each ``ARGV`` against its header.

A script's arguments are positional on the wire, so a builder is the one place that must stay
in step with its ``lua/<script>.lua`` header: the builder's parameters are the header's ARGV
names, in the header's order (``tests/gate/test_scripts.py`` checks it), and its KEYS list is
the header's KEYS. Change a header and its builder together. Builders only build: the gate's
runner (``base.GateBase._pipelined``) sends what they return.

On the wire a yes/no is 1 or 0, and an absent value is ''; a builder makes that encoding
(``flag``, ``or_empty``: the transitions' own modules use them too), so that a caller passes
``bool`` and ``None``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

from redis.typing import EncodableT

from .keys import Index, KeyNames, PoolNames


class ScriptCall(NamedTuple):
    """One call of the script ``script`` (a name in ``scripts.SCRIPT_NAMES``)."""

    script: str
    keys: list[str]
    args: list[EncodableT]


def flag(value: bool) -> int:
    """A yes/no as a script takes it: 1 or 0."""
    return 1 if value else 0


def or_empty(value: int | None) -> int | str:
    """An absent value as a script takes it: ''."""
    return "" if value is None else value


def claim_unwritten(shard: str, *, claim_ms: int, most_keys: int, ahead_ms: int) -> ScriptCall:
    """``shard``: one name of the unwritten index (see :class:`~.keys.Index`)."""
    return ScriptCall("claim_unwritten", [shard], [claim_ms, most_keys, ahead_ms])


def unwritten(key: str, *, count: int, keep_ms: int, min_age_ms: int = 0) -> ScriptCall:
    n = KeyNames(key)
    return ScriptCall("unwritten", [n.unwritten, n.messages, n.scan_cursors], [count, keep_ms, min_age_ms])


def replacement(key: str, *, task_id: str, ticket: int | None, max_hops: int) -> ScriptCall:
    n = KeyNames(key)
    return ScriptCall("replacement", [n.unwritten, n.recent, n.recent_older], [task_id, or_empty(ticket), max_hops])


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


def restore_ahead(key: str, staged: Sequence[str], *, limit: int, dispatch_timeout_ms: int) -> ScriptCall:
    n = KeyNames(key)
    keys = [n.meta, n.queue, n.messages, n.holders, *staged, n.wires, n.recent, n.recent_older, n.unwritten]
    return ScriptCall("restore_ahead", keys, [limit, dispatch_timeout_ms])


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
        [member, or_empty(limit), or_empty(interval_ms), hold_ms, flag(starting), grant_ms],
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
