"""What the gate's modules share: the index commands every round trip may carry, the grants' and the
replies' parsers.

:class:`~.gate.Gate` sends every script; the builders beside each script and the helpers here only
make commands and read replies.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from redis.typing import EncodableT

from .calls import ScriptCall
from .keys import Index
from .results import Grant
from .transport import Command

#: What every early move of a key in an index takes off its score (ms; a power of two, so exact), so that a
#: move that keeps an earlier score still changes it: the reaper's and the writers' reindex then sees the key
#: touched since they read it, and keeps it (``reindex.lua``).
TOUCH_MS = 2**-10


def index_commands(index: Index, keys: Iterable[str], score: int) -> list[Command]:
    """The commands moving ``keys`` early in ``index``, to ``score`` unless scored earlier already (``ZADD LT``),
    and touching each score (``TOUCH_MS``): a reindex that read the score before it cannot then remove the
    key, or move it later, as if the key were as it read it. One ``ZADD`` per shard that holds any; none for
    no key."""
    by_shard: dict[str, list[EncodableT]] = {}
    touches: list[Command] = []
    for key in dict.fromkeys(keys):
        shard = index.shard_of(key)
        by_shard.setdefault(shard, []).extend((score, key))
        touches.append(("ZINCRBY", shard, -TOUCH_MS, key))
    return [*(("ZADD", shard, "LT", *scored) for shard, scored in by_shard.items()), *touches]


def reindex_calls(index: Index, *, moves: Iterable[tuple[str, float, int]]) -> list[ScriptCall]:
    """``reindex.lua``'s calls moving each (key, score read, next score; -1 = remove) in ``index``: one per shard."""
    by_shard: dict[str, list[EncodableT]] = {}
    for key, seen, next_score in moves:
        # The score as Redis wrote it: a float index score read back whole prints without ".0".
        read = repr(seen) if seen != int(seen) else int(seen)
        by_shard.setdefault(index.shard_of(key), []).extend((key, read, next_score))
    return [ScriptCall("reindex", [shard], args) for shard, args in by_shard.items()]


def grants(key: str, flat: list[Any], pushed: Callable[[Any], bool]) -> list[Grant]:
    """The tickets a script granted, from its reply's ticket, dispatch, message, pushed quadruples
    (``pushed``: the gate's ``pushes.pushed``, which reads the last)."""
    return [
        Grant(key, int(flat[i]), int(flat[i + 1]), flat[i + 2], pushed=pushed(flat[i + 3]))
        for i in range(0, len(flat), 4)
    ]


def text(reply: bytes | str) -> str:
    """A reply as text (the gate's client reads bytes; redis-py's annotations allow either)."""
    return reply.decode() if isinstance(reply, bytes) else reply


def stored_text(reply: bytes | str) -> str:
    """Text the gate keeps for an operator (who stopped a run, and how): anyone may have written it,
    so bytes that are not UTF-8 are read too."""
    return reply.decode(errors="replace") if isinstance(reply, bytes) else reply


def scored(reply: list[Any]) -> list[tuple[bytes | str, float]]:
    """A ``WITHSCORES`` reply as (member, score) pairs: RESP3 sends pairs, RESP2 one flat list."""
    if reply and isinstance(reply[0], list):
        return [(member, float(score)) for member, score in reply]
    return [(reply[i], float(reply[i + 1])) for i in range(0, len(reply), 2)]


def texts(reply: Mapping[bytes | str, bytes | str] | list[bytes | str]) -> dict[str, str]:
    """An ``HGETALL`` reply as a dict of texts: RESP3 sends a map, RESP2 one flat list."""
    if isinstance(reply, Mapping):
        return {text(k): text(v) for k, v in reply.items()}
    return {text(reply[i]): text(reply[i + 1]) for i in range(0, len(reply), 2)}
