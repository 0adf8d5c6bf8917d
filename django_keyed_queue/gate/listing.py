"""Which keys have work in the gate, found without reading every key: for the live keys page.

Every key with a holder is in the deadline index (each call that can make a holder indexes its
key), and a key whose tickets wait with no holder is paused or blocked, each listed in a SET of
its own (``Gate.pause``, ``Gate.blocked_keys``). Reading the index earliest-due first, and those lists, finds the
keys with work in a bounded number of names, whatever the number of keys; drained keys stay in
the index until the reaper's next look, so a caller checks what it reads (``inspect_many``).
Reads only: no script, nothing written.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

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
