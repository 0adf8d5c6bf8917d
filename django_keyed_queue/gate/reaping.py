"""Recovery's side of the gate: the deadline index, the reaper's visits, releases and rebuilds.

A holder whose deadline passed (its worker died, its message was lost) is found through the
deadline index (see :class:`~.base.GateBase`) and recovered by ``reap.lua``, one key per call.
The decisions are the scripts'; ``ops/recovery.py`` acts on them (publishes, writes rows).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Sequence

from . import reap
from . import republish_soon as republishing
from .base import grants, reindex_calls, scored, text
from .calls import ScriptCall
from .inspection import stored_task_id
from .keys import BLOCKED_KEYS, KeyNames
from .pools import PoolCalls
from .reap import Reap
from .results import FinishResult, Recovery, RecoveryAction, RestoredAhead
from .scripts import Code, seconds_to_ms

logger = logging.getLogger(__name__)

#: How many tickets one call of a rebuild stages: each call's work stays bounded however deep the key
#: (one call for 100,000 tickets held Redis 1.3 s).
REBUILD_CHUNK = 200
#: How long a rebuild's staging is kept if the rebuild never ends (its process died).
STAGING_SECONDS = 3600.0


class ReaperCalls(PoolCalls):
    """Find the keys due, recover their holders, publish stranded grants again, rebuild a lost key."""

    def overdue_keys(self, seconds: float, *, limit: int = 1000) -> list[str]:
        """Keys that have needed the reaper for longer than ``seconds`` (none, while it runs); at most ``limit``.

        Two round trips: the server's clock, then the index (a read; no script)."""
        due = self._server_time_ms() - seconds_to_ms(seconds)
        return [text(m) for m in self._index_range(due, num=limit)]

    def reap(self, *, batch: int = 500, dry_run: bool = False) -> tuple[int, list[Recovery]]:
        """Recover the holders whose deadline passed, over up to ``batch`` due keys.

        Two round trips for the whole batch (one pipelined script per due key,
        then one index update), plus one to read the due keys. Safe to run
        from several processes at once: each recovery is one atomic script.
        Returns how many due keys were visited, and the recoveries.
        """
        now_ms = self._server_time_ms()
        due = self._index_range_with_scores(now_ms, num=batch)
        recoveries = self._visit(due, now_ms, dry_run=dry_run)
        return len(due), recoveries if dry_run else recoveries + self.reap_pools()

    def republish_unstarted(self, *, granted_seconds_ago: float, batch: int = 500) -> list[Recovery]:
        """Publish again every ticket granted at least ``granted_seconds_ago`` (server clock) and not started.

        For grants whose message a lost broker connection may have stranded. A
        copy that does arrive is harmless: the first to start the ticket runs,
        the gate drops the others. Due holders are recovered as by :meth:`reap`.
        Visits every key that may hold such a ticket, ``batch`` per round trip.
        """
        now_ms = self._server_time_ms()
        # A granted ticket's dispatch deadline is its grant's time plus the dispatch timeout.
        before = now_ms - seconds_to_ms(granted_seconds_ago) + self.dispatch_timeout_ms
        candidates = self._index_range_with_scores(before)
        recoveries: list[Recovery] = []
        for start in range(0, len(candidates), batch):
            recoveries += self._visit(candidates[start : start + batch], now_ms, republish_before=before)
        return recoveries

    def _visit(
        self,
        due: list[tuple[bytes | str, float]],
        now_ms: int,
        *,
        dry_run: bool = False,
        republish_before: int | None = None,
    ) -> list[Recovery]:
        """Run the reap script on each (key, index score) and move each key to its next deadline."""
        if not due:
            return []
        recoveries, moves = self._reap_each(due, now_ms, dry_run=dry_run, republish_before=republish_before)
        if not dry_run:
            # The blocked keys' list is a SET of its own slot, which reap.lua cannot write (see operator.py).
            if blocked := {r.key for r in recoveries if r.action is RecoveryAction.BLOCK}:
                self.client.sadd(BLOCKED_KEYS, *blocked)
            self._reindex(moves)
            recoveries = self._ask_pools(recoveries)
        for r in recoveries:
            logger.debug("reap key=%r ticket=%s action=%s dry_run=%s", r.key, r.ticket, r.action, dry_run)
        return recoveries

    def _reap_each(
        self,
        due: list[tuple[bytes | str, float]],
        now_ms: int,
        *,
        dry_run: bool = False,
        republish_before: int | None = None,
    ) -> tuple[list[Recovery], list[tuple[str, float, int]]]:
        """A pass's first half: the reap script on each (key, index score) read, in one round trip; the
        recoveries, and each key's move in the index (its score read, its next deadline; -1: none)."""
        replies = self._pipelined(
            [reap.call(Reap(text(m), dry_run=dry_run, republish_before=republish_before), self) for m, _ in due]
        )
        recoveries: list[Recovery] = []
        moves: list[tuple[str, float, int]] = []
        longest_gap = min(self.lease_ms, self.dispatch_timeout_ms)
        for (member, seen), reply in zip(due, replies, strict=True):
            next_deadline, recovered = reap.parse(text(member), reply, self.pushes.pushed)
            recoveries += recovered
            # Look again at the key's next deadline, and at least that often while it has holders.
            moves.append((text(member), seen, -1 if next_deadline < 0 else min(next_deadline, now_ms + longest_gap)))
        return recoveries, moves

    def _reindex(self, moves: list[tuple[str, float, int]]) -> None:
        """A pass's second half: each key moved to its next deadline, or removed, unless a call indexed it
        since its score was read (a new holder's deadline is then the one that counts)."""
        self._pipelined(reindex_calls(self.deadlines, moves=moves))

    def republish_soon(self, key: str, ticket: int, dispatch: int, *, delay_seconds: float) -> bool:
        """The message of a granted ticket failed to publish: the reaper publishes it after ``delay_seconds``.

        False if the ticket is no longer granted with that dispatch (it started, ended, or moved on).
        """
        return self._republish_soon(key, ticket, dispatch, delay_seconds, count=False) is not None

    def republish_after(self, key: str, ticket: int, dispatch: int, *, delay_seconds: float) -> bool:
        """A granted ticket's message went out with an eta: the reaper publishes it again only
        ``delay_seconds`` from now (past that eta), not at its dispatch deadline. False if the ticket is no
        longer granted with that dispatch."""
        return self._republish_soon(key, ticket, dispatch, delay_seconds, count=False, later=True) is not None

    def undelivered(self, key: str, ticket: int, dispatch: int, *, delay_seconds: float) -> int | None:
        """A worker dropped the message of a granted ticket undelivered (it knows no such task): the reaper
        publishes it after ``delay_seconds``. How many times the ticket was dropped so, or None if it is no
        longer granted with that dispatch."""
        return self._republish_soon(key, ticket, dispatch, delay_seconds, count=True)

    def _republish_soon(
        self, key: str, ticket: int, dispatch: int, delay_seconds: float, *, count: bool, later: bool = False
    ) -> int | None:
        delay_ms = seconds_to_ms(delay_seconds)
        keep_ms = self.idle_horizon_ms if count else None
        call = republishing.call(key, ticket, dispatch, delay_ms=delay_ms, undelivered_keep_ms=keep_ms, later=later)
        [reply] = self._pipelined([call], index=key, index_within_ms=delay_ms)
        return republishing.parse(key, ticket, reply)

    def release(self, key: str, ticket: int, *, dispatch: int | None = None, unstarted: bool = False) -> list[Recovery]:
        """Recover ``ticket``'s holder now, as the reaper does when its deadline passes.

        A running holder is fenced and re-dispatched (or failed, past its
        recoveries); a granted one is published again, with its next dispatch. Any
        other due holder of the key is recovered too. With ``dispatch``, only that
        dispatch of the ticket is released: a second release of it finds it moved on.
        With ``unstarted``, only a holder granted and not started is released (one that started meanwhile
        is left running). The ticket is among the recoveries only if it was released.
        """
        release = Reap(key, release=ticket, released_dispatch=dispatch, released_unstarted=unstarted)
        [reply] = self._pipelined([reap.call(release, self)], index=key)
        return self._ask_pools(reap.parse(key, reply, self.pushes.pushed)[1])

    def _ask_pools(self, recoveries: list[Recovery]) -> list[Recovery]:
        """The recoveries, those of tickets waiting for their pool replaced by what their pool said."""
        waiting = [r for r in recoveries if r.action is RecoveryAction.POOL]
        if not waiting:
            return recoveries
        return [r for r in recoveries if r.action is not RecoveryAction.POOL] + self.ask_pools_again(waiting)

    def rebuild(self, key: str, *, last_ticket: int, waiting: list[tuple[int, bytes]], limit: int = 1) -> FinishResult:
        """Restore a key lost with Redis: ``waiting`` (ticket, message) pairs, oldest first.

        Returns the tickets granted at once; ``Code.EXISTS`` if the key has
        any state in Redis (nothing is changed then). One call per ``REBUILD_CHUNK``
        tickets stages them, then one call makes them the key's.
        """
        staged = self._staged(key, waiting)
        call = rebuild_call(
            key, staged, last_ticket=last_ticket, limit=limit, dispatch_timeout_ms=self.dispatch_timeout_ms
        )
        reply = self._call_and_index(call, key)
        return FinishResult(Code(reply[0]), grants(key, reply[1:], self.pushes.pushed))

    def restore_ahead(self, key: str, *, messages: list[bytes], limit: int = 1) -> RestoredAhead:
        """Restore ``messages`` (oldest first) of a key lost with Redis that took submissions since: after the
        key's holders, before its waiting tickets, which are numbered again after them (``renumbered``).
        ``Code.NOT_GRANTED`` if the key has no state (:meth:`rebuild` restores it whole); nothing changed then.
        Staged as :meth:`rebuild` stages; the last call's work grows with the key's queue."""
        staged = self._staged(key, list(enumerate(messages, start=1)))
        call = restore_ahead_call(key, staged, limit=limit, dispatch_timeout_ms=self.dispatch_timeout_ms)
        reply = self._call_and_index(call, key)
        if Code(reply[0]) is not Code.OK:
            return RestoredAhead(Code(reply[0]))
        first, count, moved = int(reply[1]), int(reply[2]), int(reply[3])
        pairs = reply[4 : 4 + 2 * moved]
        renumbered = {int(pairs[i]): int(pairs[i + 1]) for i in range(0, len(pairs), 2)}
        granted = grants(key, reply[4 + 2 * moved :], self.pushes.pushed)
        logger.debug("restore_ahead key=%r tickets=%s.. renumbered=%s", key, first, renumbered)
        return RestoredAhead(Code.OK, list(range(first, first + count)), renumbered, granted)

    def _staged(self, key: str, waiting: list[tuple[int, bytes]]) -> list[str]:
        """Stage ``waiting`` (ticket or number, message) pairs for a rebuild of ``key``, ``REBUILD_CHUNK`` a
        call; the staging's names, this rebuild's own (two racing rebuilds never mix)."""
        staged = KeyNames(key).staged(uuid.uuid4().hex)
        for start in range(0, len(waiting), REBUILD_CHUNK):
            chunk = waiting[start : start + REBUILD_CHUNK]
            self._call(stage_rebuild_call(staged, keep_ms=seconds_to_ms(STAGING_SECONDS), waiting=chunk))
        return staged

    def held_task_ids(self, key: str) -> set[str]:
        """The task ids of every ticket of ``key`` the gate keeps a message of (its holders and its queue),
        read in bounded steps (``HSCAN``); reads only."""
        found: set[str] = set()
        for _, raw in self.client.hscan_iter(KeyNames(key).messages, count=REBUILD_CHUNK):
            task_id = stored_task_id(raw)
            if task_id is not None:
                found.add(task_id)
        return found

    def task_ids_at(self, key: str, tickets: list[int]) -> dict[int, str]:
        """The task id of each of ``tickets`` of ``key`` whose message the gate keeps; reads only."""
        if not tickets:
            return {}
        raws = self.client.hmget(KeyNames(key).messages, tickets)
        return {t: task_id for t, raw in zip(tickets, raws, strict=True) if (task_id := stored_task_id(raw))}

    def _index_range(self, max_score: int, *, num: int) -> list[bytes | str]:
        """The keys of the deadline index scored at most ``max_score``, earliest first; at most ``num``."""
        return [member for member, _ in self._index_range_with_scores(max_score, num=num)]

    def _index_range_with_scores(self, max_score: int, *, num: int | None = None) -> list[tuple[bytes | str, float]]:
        """(key, score) pairs of the deadline index scored at most ``max_score``, earliest first; all with None.

        One round trip: ``num`` from each shard, then the earliest ``num`` of them all.
        """
        limit = () if num is None else ("LIMIT", 0, num)
        replies = self._run(
            [("ZRANGEBYSCORE", shard, "-inf", max_score, "WITHSCORES", *limit) for shard in self.deadlines.names]
        )
        due = [pair for reply in replies for pair in scored(reply)]
        if len(replies) > 1:
            due.sort(key=lambda pair: pair[1])
        return due if num is None else due[:num]


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
