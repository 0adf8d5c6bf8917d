"""Which keys have work in the gate, found without reading every key: for the live keys page.

Every key with a holder is in the deadline index (each call that can make a holder indexes its
key), and a key whose tickets wait with no holder is paused or blocked, each listed in a SET of
its own (``operator.py``). Reading the index earliest-due first, and those lists, finds the
keys with work in a bounded number of names, whatever the number of keys; drained keys stay in
the index until the reaper's next look, so a caller checks what it reads (``inspect_many``).
Reads only: no script, nothing written.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from .base import GateBase, text
from .keys import BLOCKED_KEYS, OVERRIDDEN_KEYS, PAUSED_KEYS, KeyNames

#: How many names one ZSCAN or SSCAN step of a search asks Redis to examine: with MATCH, about 0.75 ms of
#: Redis' time (20,000 took 15 ms, a pause for every other client).
SCAN_STEP = 1000

# Redis' glob takes these as patterns; a backslash makes each literal.
_GLOB_SPECIAL = re.compile(r"([\\*?\[\]])")


def glob_escape(text_: str) -> str:
    """``text_`` as a glob (``MATCH``) that matches it literally."""
    return _GLOB_SPECIAL.sub(r"\\\1", text_)


@dataclass(frozen=True)
class IndexedKeys:
    """The keys the deadline index holds, the earliest-due first, and how many it holds in all."""

    keys: list[str]
    total: int


@dataclass(frozen=True)
class MatchedKeys:
    """The keys a search found, and whether it examined every name (else it stopped at its budget)."""

    keys: list[str]
    complete: bool


class ListingCalls(GateBase):
    """Read the deadline index earliest first, search it and the operator's lists, check keys hold nothing."""

    def indexed_keys(self, *, limit: int) -> IndexedKeys:
        """At most ``limit`` keys of the deadline index, the earliest-due first (the overdue ones lead), and
        how many keys it holds. On a cluster, the earliest ``limit / shards`` (rounded up) of each shard.
        One round trip."""
        shards = self.deadlines.names
        share = -(-limit // len(shards))
        pipe = self.client.pipeline(transaction=False)
        for shard in shards:
            pipe.zrange(shard, 0, share - 1, withscores=True)
        for shard in shards:
            pipe.zcard(shard)
        replies = pipe.execute()
        scored = sorted(((score, text(m)) for reply in replies[: len(shards)] for m, score in reply))
        return IndexedKeys([key for _, key in scored[:limit]], sum(replies[len(shards) :]))

    def keys_matching(self, pattern: str, *, budget: int) -> MatchedKeys:
        """The keys of the deadline index and of the paused, blocked and overridden lists whose name matches
        ``pattern``, a glob as Redis' ``MATCH`` takes it (see :func:`glob_escape`), each once, sorted.

        Steps of ZSCAN and SSCAN (``SCAN_STEP`` names each), one round trip for a step of every list not
        read through yet, until about ``budget`` names were examined: a search costs Redis at most that,
        however many keys there are. ``complete`` says whether every name was examined.
        """
        cursors: dict[tuple[str, bool], int] = {(shard, True): 0 for shard in self.deadlines.names}
        cursors.update({(name, False): 0 for name in (PAUSED_KEYS, BLOCKED_KEYS, OVERRIDDEN_KEYS)})
        found: set[str] = set()
        examined = 0
        while cursors and examined < budget:
            pipe = self.client.pipeline(transaction=False)
            sent = list(cursors)
            for name, scored in sent:
                scan = pipe.zscan if scored else pipe.sscan
                scan(name, cursors[name, scored], match=pattern, count=SCAN_STEP)
            for (name, scored), (cursor, members) in zip(sent, pipe.execute(), strict=True):
                found.update(text(m[0] if scored else m) for m in members)
                if int(cursor) == 0:
                    del cursors[name, scored]
                else:
                    cursors[name, scored] = int(cursor)
            examined += SCAN_STEP * len(sent)
        return MatchedKeys(sorted(found), not cursors)

    def holding_nothing(self, keys: Sequence[str]) -> set[str]:
        """Which of ``keys`` hold nothing in the gate: no holder, no ticket waiting, and no record kept for
        the database (a submission's, a finished run's), which would soon change their rows. One round trip,
        an ``EXISTS`` a key (Redis keeps no empty hash or list)."""
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            names = KeyNames(key)
            pipe.exists(names.holders, names.queue, names.outcomes, names.unwritten)
        return {key for key, found in zip(keys, pipe.execute(), strict=True) if not found}
