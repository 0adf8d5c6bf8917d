"""Records the gate keeps until the database has them: submissions' records and finished runs' outcomes.

A producer writes no row: ``submit`` keeps the submission's record with its ticket, and the
workers' writers (``records/submissions.py``) claim keys of the unwritten index, read their
records, write the rows and forget them here. ``finish`` keeps a run's outcome the same way
until the worker's recorder wrote it (the reaper hands back those left too long).
"""

from __future__ import annotations

from .calls import ScriptCall, or_empty
from .keys import KeyNames

#: About how many of one key's kept submission records one ``unwritten`` call reads: Redis' work per
#: call stays bounded however deep the key (100,000 parked once took one call 484 ms).
UNWRITTEN_PER_KEY = 500


def claim_unwritten_call(shard: str, *, claim_ms: int, most_keys: int, ahead_ms: int) -> ScriptCall:
    """``claim_unwritten.lua``'s call on ``shard``: one name of the unwritten index (see :class:`~.keys.Index`)."""
    return ScriptCall("claim_unwritten", [shard], [claim_ms, most_keys, ahead_ms])


def unwritten_call(key: str, *, count: int, keep_ms: int, min_age_ms: int = 0) -> ScriptCall:
    n = KeyNames(key)
    return ScriptCall("unwritten", [n.unwritten, n.messages, n.scan_cursors], [count, keep_ms, min_age_ms])


def replacement_call(key: str, *, task_id: str, ticket: int | None, max_hops: int) -> ScriptCall:
    n = KeyNames(key)
    return ScriptCall("replacement", [n.unwritten, n.recent, n.recent_older], [task_id, or_empty(ticket), max_hops])
