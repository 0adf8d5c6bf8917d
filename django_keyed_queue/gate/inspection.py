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

from redis.cluster import RedisCluster

from . import newer_waiting as newer
from .base import GateBase, stored_text, text
from .keys import KeyNames
from .results import Holder, HolderState, KeySnapshot, Lease, Stopping
from .scripts import ms_to_seconds


class InspectCalls(GateBase):
    """Snapshots of keys, a ticket's place in its queue, whether a lease still holds."""

    def inspect(self, key: str, *, waiting_shown: int | None = None) -> KeySnapshot:
        """A read-only snapshot of one key, a ``KeySnapshot`` (several reads in one pipelined round trip)."""
        return self.inspect_many([key], waiting_shown=waiting_shown)[0]

    def waiting_ahead(self, key: str, ticket: int, task_id: str | None = None) -> int | None:
        """How many tickets wait ahead of ``ticket`` in ``key``'s queue; None if it does not wait there
        (or, with ``task_id``, if the ticket waiting is another task's). One ``LPOS``: it reads the
        queue up to the ticket."""
        names = KeyNames(key)
        pipe = self.client.pipeline(transaction=False)
        pipe.lpos(names.queue, str(ticket))
        pipe.hget(names.messages, str(ticket))
        position, message = pipe.execute()
        if position is None or (task_id is not None and stored_task_id(message) != task_id):
            return None
        return int(position)

    def inspect_many(
        self, keys: Sequence[str], *, waiting_shown: int | None = None, task_ids: bool = True
    ) -> list[KeySnapshot]:
        """Snapshots of many keys, one ``KeySnapshot`` per key in order, in one pipelined round trip.

        ``waiting`` lists the oldest ``waiting_shown`` waiting tickets (all with None);
        ``depth`` counts them all. ``holders`` maps each ticket holding a slot (at most the
        key's limit) to its ``Holder``: its state, ``running`` or ``granted``, its dispatch,
        token, attempts and lost leases, the seconds left before its deadline, and the task id of
        its stored message (one more round trip, for the keys that have holders; none without
        ``task_ids``: :meth:`with_task_ids` reads them later, for the snapshots kept).
        """
        # LRANGE's end is inclusive and -1 is the last element: (1, 0) is the empty range.
        shown = (0, -1) if waiting_shown is None else (0, waiting_shown - 1) if waiting_shown else (1, 0)
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            names = KeyNames(key)
            pipe.hgetall(names.meta)
            pipe.lrange(names.queue, *shown)
            pipe.llen(names.queue)
            pipe.hgetall(names.holders)
            pipe.hlen(names.messages)
            pipe.pttl(names.meta)
        # A cluster's pipeline sends no keyless command: its clock is read apart (any master's will do).
        timed = not isinstance(self.client, RedisCluster)
        if timed:
            pipe.time()
        replies = pipe.execute()
        secs, micros = replies.pop() if timed else self.client.time()
        now_ms = secs * 1000 + micros // 1000
        snapshots = []
        for i, key in enumerate(keys):
            meta, queue, depth, holders, messages, ttl_ms = replies[6 * i : 6 * i + 6]
            snapshots.append(
                KeySnapshot(
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
            )
        return self.with_task_ids(snapshots) if task_ids else snapshots

    def with_task_ids(self, snapshots: list[KeySnapshot]) -> list[KeySnapshot]:
        """``snapshots`` with each holder's task id read from its stored message (one pipelined round trip)."""
        held = [s for s in snapshots if s.holders]
        if not held:
            return snapshots
        pipe = self.client.pipeline(transaction=False)
        for snapshot in held:
            pipe.hmget(KeyNames(snapshot.key).messages, list(snapshot.holders))
        named = {}
        for snapshot, raws in zip(held, pipe.execute(), strict=True):
            holders = {
                ticket: replace(holder, task_id=stored_task_id(raw))
                for (ticket, holder), raw in zip(snapshot.holders.items(), raws, strict=True)
            }
            named[snapshot.key] = replace(snapshot, holders=holders)
        return [named.get(s.key, s) for s in snapshots]

    def stored_messages(self, tickets: Sequence[tuple[str, int]]) -> list[bytes | None]:
        """The message stored with each of ``tickets`` ((key, ticket) pairs), None where there is none; one
        round trip."""
        pipe = self.client.pipeline(transaction=False)
        for key, ticket in tickets:
            pipe.hget(KeyNames(key).messages, str(ticket))
        return pipe.execute() if tickets else []

    def keys_with_state(self, keys: Sequence[str]) -> set[str]:
        """Which of ``keys`` have state in Redis, as ``rebuild`` refuses them (one pipelined round trip)."""
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            names = KeyNames(key)
            pipe.exists(names.meta, names.queue, names.messages, names.holders)
        return {key for key, found in zip(keys, pipe.execute(), strict=True) if found}

    def newer_waiting(self, key: str, task_name: str, ticket: int) -> bool:
        """Whether a submission of coalescing task ``task_name`` newer than ``ticket`` waits in ``key``'s
        queue (``submit(coalesce=...)`` parked it); one script call, reads only."""
        return newer.parse(self._call(newer.call(key, task_name, ticket)))

    def holds(self, lease: Lease) -> bool:
        """True while ``lease`` is the running holder of its ticket (not fenced)."""
        raw = self.client.hget(KeyNames(lease.key).holders, lease.ticket)
        if raw is None:
            return False
        holder = decode_holder(raw, now_ms=0)  # its deadline is not read
        return holder.state == "running" and holder.token == lease.token


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
