"""Reading a key's state without changing it: snapshots for the admin, the live pages and recovery.

Reads only, pipelined, no script (but ``newer_waiting``, a few reads that depend on each other):
a snapshot must not take the key's slot for longer than its reads. The holder record is
therefore parsed here, in Python: :func:`decode_holder` is its one home on this side,
``decode_holder`` in ``lua/includes/common.lua`` the one on the Lua side (which also describes
the format). Change both together.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from .base import stored_text, text
from .results import Holder, HolderState, KeySnapshot, Stopping
from .scripts import ms_to_seconds


def key_snapshot(key: str, replies: Sequence[Any], now_ms: int) -> KeySnapshot:
    """A key's snapshot from its six reads (``HGETALL`` meta, ``LRANGE`` and ``LLEN`` queue, ``HGETALL`` holders,
    ``HLEN`` messages, ``PTTL`` meta) at the server's ``now_ms``."""
    meta, queue, depth, holders, messages, ttl_ms = replies
    return KeySnapshot(
        key=key,
        last_ticket=int(meta.get(b"seq", 0)),
        last_token=int(meta.get(b"fence", 0)),
        paused=b"paused" in meta,
        paused_since=_paused_since(meta.get(b"paused")),
        paused_by=meta.get(b"paused_by", b"").decode(errors="replace"),
        since_last_start=_ms_since(meta.get(b"last_start"), now_ms),
        blocked=int(meta[b"blocked"]) if b"blocked" in meta else None,
        waiting=[int(t) for t in queue],
        depth=depth,
        holders=_operators_marks({int(t): decode_holder(raw, now_ms) for t, raw in holders.items()}, meta),
        messages=messages,
        idle_expires_in=ms_to_seconds(ttl_ms) if ttl_ms >= 0 else None,
        limit_override=_int_or_none(meta.get(b"limit_override")),
        interval_override_ms=_int_or_none(meta.get(b"interval_override")),
    )


def _operators_marks(holders: dict[int, Holder], meta: dict[bytes, bytes]) -> dict[int, Holder]:
    """``holders`` with what an operator did to each, as meta notes it for its dispatch: who stopped a
    running one (``stop.lua``), whether a granted one was run now (``run_now.lua``)."""
    for ticket, holder in holders.items():
        if holder.state == "granted" and meta.get(b"now:%d" % ticket) == str(holder.dispatch).encode():
            holders[ticket] = replace(holder, run_now=True)
        noted = meta.get(b"stop:%d" % ticket) if holder.state == "running" else None
        parts = stored_text(noted).split("|", 3) if noted else []
        if len(parts) == 4 and parts[0] == str(holder.dispatch) and parts[1].isdigit():
            holders[ticket] = replace(holder, stopping=Stopping(parts[3], int(parts[1]), parts[2]))
    return holders


def stored_task_id(raw: bytes | str | None) -> str | None:
    """The task id a stored message names (its JSON's ``id``, as ``start.lua`` reads it); None if there is
    no message or it names none. JSON only: anyone may have written it."""
    try:
        task_id = json.loads(raw)["id"] if raw else None
    except (ValueError, TypeError, KeyError, RecursionError):
        return None
    return task_id if isinstance(task_id, str) else None


def _int_or_none(raw: bytes | None) -> int | None:
    """A number meta keeps, None if it keeps none (or not a number: anyone may have written it)."""
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def decode_holder(raw: bytes | str, now_ms: int) -> Holder:
    """A holder record, "<state>|<dispatch>|<token>|<deadline_ms>|<attempts>|<lost>|<max_lost>|<block>"
    as ``encode_holder`` in ``lua/includes/common.lua`` writes it (which says what each field means);
    its deadline made relative to ``now_ms``. A record written before ``block`` existed ends at ``max_lost``.
    """
    state, dispatch, token, deadline, attempts, lost, max_lost, *block = text(raw).split("|")
    return Holder(
        state=_HOLDER_STATES[state],
        dispatch=int(dispatch),
        token=int(token),
        attempts=int(attempts),
        lost=int(lost),
        max_lost=int(max_lost),
        blocks_on_failure=block == ["1"],
        deadline_in=ms_to_seconds(int(deadline) - now_ms),
    )


_HOLDER_STATES: dict[str, HolderState] = {"r": "running", "g": "granted", "b": "blocked", "w": "waiting_for_pool"}


def _ms_since(value: bytes | None, now_ms: int) -> float | None:
    """Seconds from a server-clock ms value to ``now_ms``; None if there is none (or it is not a number)."""
    return ms_to_seconds(now_ms - int(value)) if value and value.isdigit() else None


def _paused_since(value: bytes | None) -> float | None:
    """When a key was paused (seconds since the epoch, server clock); None if it is not, or if an earlier
    version of the app paused it (it kept 1, no time)."""
    since = int(value) / 1000 if value and value.isdigit() else 0
    return since if since > 1 else None
