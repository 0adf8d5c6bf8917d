"""Recovery's side of the gate: the deadline index, the reaper's visits, releases and rebuilds.

A holder whose deadline passed (its worker died, its message was lost) is found through the
deadline index (see :class:`~.gate.Gate`) and recovered by ``reap.lua``, one key per call.
The decisions are the scripts'; ``ops/actions/recovery.py`` acts on them (publishes, writes rows).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from .calls import ScriptCall
from .keys import KeyNames

logger = logging.getLogger(__name__)

#: How many tickets one call of a rebuild stages: each call's work stays bounded however deep the key
#: (one call for 100,000 tickets held Redis 1.3 s).
REBUILD_CHUNK = 200
#: How long a rebuild's staging is kept if the rebuild never ends (its process died).
STAGING_SECONDS = 3600.0


def stage_rebuild_call(staged: Sequence[str], *, keep_ms: int, waiting: Iterable[tuple[int, bytes]]) -> ScriptCall:
    """``staged``: the rebuild's own queue and messages (:meth:`~.keys.KeyNames.staged`)."""
    return ScriptCall("stage_rebuild", list(staged), [keep_ms, *(v for pair in waiting for v in pair)])


def rebuild_call(
    key: str, staged: Sequence[str], *, last_ticket: int, limit: int, dispatch_timeout_ms: int
) -> ScriptCall:
    n = KeyNames(key)
    keys = [n.meta, n.queue, n.messages, n.holders, *staged, n.wires]
    return ScriptCall("rebuild", keys, [last_ticket, limit, dispatch_timeout_ms])


def restore_ahead_call(key: str, staged: Sequence[str], *, limit: int, dispatch_timeout_ms: int) -> ScriptCall:
    n = KeyNames(key)
    keys = [n.meta, n.queue, n.messages, n.holders, *staged, n.wires, n.recent, n.recent_older, n.unwritten]
    return ScriptCall("restore_ahead", keys, [limit, dispatch_timeout_ms])
