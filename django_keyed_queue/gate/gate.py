"""The gate: one atomic Lua call per state transition of a ticket."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import redis
from redis.cluster import RedisCluster
from redis.commands.core import Script
from redis.exceptions import NoScriptError
from redis.typing import EncodableT

from .keys import (
    BLOCKED_KEYS,
    CLUSTER_INDEX_SHARDS,
    DEADLINE_INDEX,
    PAUSED_KEYS,
    UNWRITTEN_INDEX,
    Index,
    KeyNames,
)
from .results import (
    FinishResult,
    Grant,
    Holder,
    HolderState,
    KeySnapshot,
    Lease,
    Outcome,
    QueueFull,
    Recovery,
    RecoveryAction,
    StartResult,
    Submission,
    SubmitResult,
    Unwritten,
    UnwrittenRecords,
)
from .scripts import SCRIPT_NAMES, Code, ms_to_seconds, seconds_to_ms, source
from .transport import Command, NotSent, ReplicasBehind, Replication, transport_for

logger = logging.getLogger(__name__)

#: How many tickets one call of a rebuild stages: each call's work stays bounded however deep the key
#: (one call for 100,000 tickets held Redis 1.3 s).
REBUILD_CHUNK = 200
#: How long a rebuild's staging is kept if the rebuild never ends (its process died).
STAGING_SECONDS = 3600.0
#: Who paused a key is kept to this many characters (an operator's name; a command's own words).
PAUSED_BY_MAX = 200

#: About how many of one key's kept submission records one ``unwritten`` call reads: Redis' work per
#: call stays bounded however deep the key (100,000 parked once took one call 484 ms).
UNWRITTEN_PER_KEY = 500

#: A submission retried after its reply was lost finds its ticket for at least this long.
RECENT_SUBMISSION_SECONDS = 30.0


class Gate:
    """Per-key FIFO of tickets in Redis; at most ``limit`` tickets of a key hold a slot.

    Every method is one script call (one round trip) unless it says otherwise.
    Durations are seconds at this API and milliseconds inside Redis.

    Keys that may need the reaper are found through a sorted set, the
    deadline index (logical key -> when to look); on a Redis Cluster it is
    split in shards (see :class:`~.keys.Index`). It is not in the keys' slots,
    so the scripts cannot write it: each call that can create a holder sends
    a ``ZADD LT`` of an early estimate in the same round trip, and the
    reaper, after visiting a key, moves it to the key's real next deadline.
    The unwritten index (keys holding submission records not yet written
    to the database) is kept the same way.
    """

    def __init__(
        self,
        client: redis.Redis | RedisCluster,
        *,
        lease_seconds: float = 60.0,
        dispatch_timeout_seconds: float = 300.0,
        idle_horizon_seconds: float = 86400.0,
        outcome_grace_seconds: float = 10.0,
        wait_replicas: int = 0,
        wait_timeout_seconds: float = 1.0,
    ) -> None:
        self.client = client
        self.lease_ms = seconds_to_ms(lease_seconds)
        self.dispatch_timeout_ms = seconds_to_ms(dispatch_timeout_seconds)
        self.idle_horizon_ms = seconds_to_ms(idle_horizon_seconds)
        #: How long a finished run's outcome may wait for its worker to write the record.
        self.outcome_grace_ms = seconds_to_ms(outcome_grace_seconds)
        self._scripts = {name: client.register_script(source(name)) for name in SCRIPT_NAMES}
        self._transport = transport_for(client, Replication(wait_replicas, seconds_to_ms(wait_timeout_seconds)))
        shards = CLUSTER_INDEX_SHARDS if isinstance(client, RedisCluster) else 1
        self.deadlines = Index(DEADLINE_INDEX, shards)
        self.unwritten_index = Index(UNWRITTEN_INDEX, shards)

    def _call(self, name: str, keys: Sequence[str], args: Sequence[EncodableT]) -> Any:
        return self._pipelined(name, [(keys, args)])[0]

    def _call_and_index(self, name: str, key: str, keys: Sequence[str], args: Sequence[EncodableT]) -> list[Any]:
        """Run a script that may create a holder of ``key``, and index the key, in one round trip."""
        reply: list[Any] = self._pipelined(name, [(keys, args)], index=key)[0]
        return reply

    def _index_unwritten(self, keys: Iterable[str]) -> list[Command]:
        """The commands scoring ``keys`` 0 in the unwritten index (records kept for them); none for no key."""
        return _index_commands(self.unwritten_index, keys, 0)

    def _deadline_hint_ms(self, within_ms: int | None = None) -> int:
        # A holder created now has a deadline no earlier than ``within_ms`` from now (by default the
        # shortest a new holder can have), on a clock within a second of this host's; looking early
        # only costs a visit.
        if within_ms is None:
            within_ms = min(self.lease_ms, self.dispatch_timeout_ms)
        return int(time.time() * 1000) + within_ms - 1000

    def submit(
        self,
        key: str,
        message: bytes,
        *,
        limit: int = 1,
        start: bool = False,
        join_id: str = "",
        max_lost: int = 0,
        block: bool = False,
        task_id: str = "",
        retried: bool = False,
        max_waiting: int = 0,
        record: bytes = b"",
    ) -> SubmitResult | None:
        """Take the next ticket of ``key`` and store ``message`` with it.

        With ``start=True`` a granted ticket is also started (its lease begins;
        ``max_lost`` and ``block`` as for :meth:`start`).
        A non-empty ``join_id`` seen before within the idle horizon makes this a
        duplicate: nothing changes and None is returned.
        ``retried=True`` after a call whose reply was lost: the ticket ``task_id``
        took, if it still holds exactly ``message``, is returned as it stands and
        none is taken (found for at least ``RECENT_SUBMISSION_SECONDS``).
        ``max_waiting`` > 0: raises QueueFull, taking nothing, when this ticket
        would wait behind that many others.
        A non-empty ``record`` is kept with the ticket until :meth:`forget_unwritten`
        (see :meth:`claim_unwritten`).
        """
        call = self._submit_call(
            key, message, limit=limit, lease_ms=self.lease_ms if start else 0, join_id=join_id, max_lost=max_lost,
            block=block, task_id=task_id, retried=retried, max_waiting=max_waiting, record=record,
        )  # fmt: skip
        [reply] = self._pipelined("submit", [call], index=key, also=self._index_unwritten([key] if record else []))
        if reply[0] == Code.DUPLICATE:
            logger.debug("submit key=%r join_id=%s duplicate", key, join_id)
            return None
        result = self._submit_result(key, reply)
        if isinstance(result, QueueFull):
            raise result
        return result

    def submit_many(
        self, submissions: Sequence[Submission], *, retried: bool = False
    ) -> list[SubmitResult | QueueFull]:
        """Submit each of ``submissions`` as :meth:`submit` does, in order, in one round trip.

        A key at its ``max_waiting`` gets its ``QueueFull`` in the list, and no ticket.
        """
        calls = [
            self._submit_call(
                s.key,
                s.message,
                limit=s.limit,
                task_id=s.task_id,
                retried=retried,
                max_waiting=s.max_waiting,
                record=s.record,
            )  # fmt: skip
            for s in submissions
        ]
        if not calls:
            return []
        recorded = [s.key for s in submissions if s.record]
        replies = self._pipelined(
            "submit", calls, index=[s.key for s in submissions], also=self._index_unwritten(recorded)
        )
        return [self._submit_result(s.key, reply) for s, reply in zip(submissions, replies, strict=True)]

    def _submit_call(
        self,
        key: str,
        message: bytes,
        *,
        limit: int,
        lease_ms: int = 0,
        join_id: str = "",
        max_lost: int = 0,
        block: bool = False,
        task_id: str,
        retried: bool,
        max_waiting: int,
        record: bytes,
    ) -> tuple[list[str], list[EncodableT]]:
        names = KeyNames(key)
        keys = [*names.all(), names.joined, names.recent, names.recent_older, names.unwritten]
        args: list[EncodableT] = [
            message, limit, self.dispatch_timeout_ms, lease_ms, join_id, self.idle_horizon_ms, max_lost,
            "1" if retried else "", task_id, max_waiting, seconds_to_ms(RECENT_SUBMISSION_SECONDS), record, int(block),
        ]  # fmt: skip
        return keys, args

    @staticmethod
    def _submit_result(key: str, reply: list[Any]) -> SubmitResult | QueueFull:
        code, ticket, token, _ = reply
        if code == Code.QUEUE_FULL:
            return QueueFull(key, int(ticket))
        result = SubmitResult(ticket=int(ticket), granted=code == Code.OK, token=int(token))
        logger.debug("submit key=%r ticket=%s granted=%s", key, result.ticket, result.granted)
        return result

    def start(
        self,
        key: str,
        ticket: int,
        dispatch: int,
        *,
        max_lost: int = 0,
        block: bool = False,
        task_id: str = "",
        interval_ms: int = 0,
    ) -> StartResult:
        """Check the message of dispatch ``dispatch`` may run ``ticket`` and start its lease.

        With ``task_id``, the message must also be the ticket's own: the one
        stored with it has that task id (``Code.FOREIGN_MESSAGE`` if not).
        If the lease expires, the reaper re-dispatches the ticket ``max_lost``
        times; the next time it fails the ticket and frees its slot. With
        ``block``, a failure for good (that one, or :meth:`finish` with
        ``block``) keeps the slot instead, and the key grants nothing until
        :meth:`unblock`. With ``interval_ms``, the key's starts are at least that far apart:
        a start sooner after the last one is ``Code.TOO_EARLY``, with the wait and the ticket's
        stored message (to send again for then).
        """
        names = KeyNames(key)
        # Indexed too: this process's lease may be shorter than the one the granting process assumed.
        code, token, attempts, deadline, *message = self._call_and_index(
            "start",
            key,
            [names.meta, names.holders, names.messages],
            [ticket, dispatch, self.lease_ms, max_lost, task_id, int(block), interval_ms],
        )
        if code == Code.TOO_EARLY:
            return StartResult(
                Code(code), attempts=int(attempts), wait_seconds=ms_to_seconds(deadline), message=message[0]
            )
        result = StartResult(Code(code), int(token), int(attempts), int(deadline))
        logger.debug("start key=%r ticket=%s code=%s", key, ticket, result.code.name)
        return result

    def wait_to_start(self, key: str, ticket: int, dispatch: int, *, interval_ms: int) -> tuple[float, bytes | None]:
        """Seconds before the message of ``dispatch`` may start ``ticket`` under a rate of one start per
        ``interval_ms`` on ``key``, and the ticket's stored message if it must wait; (0.0, None) when it
        may start now, or may not start at all (:meth:`start` says why). A check, not a claim."""
        names = KeyNames(key)
        wait, *message = self._call(
            "wait_to_start", [names.meta, names.holders, names.messages], [ticket, dispatch, interval_ms, self.lease_ms]
        )
        return (ms_to_seconds(int(wait)), message[0]) if wait else (0.0, None)

    def finish(
        self,
        key: str,
        ticket: int,
        token: int,
        *,
        limit: int = 1,
        outcome: Outcome | None = None,
        block: bool = False,
    ) -> FinishResult:
        """End a running ticket and grant the next ones; their messages are returned.

        ``outcome`` is kept with the key until
        :meth:`forget_outcomes`; the reaper hands back outcomes left too long.
        ``block``: the run failed for good and its task blocks its key on failure:
        the ticket keeps its slot and the key is blocked (``Code.BLOCKED``) until
        :meth:`unblock`; it is listed among :meth:`blocked_keys` in the same round trip.
        """
        names = KeyNames(key)
        task_id, record = (outcome.task_id, outcome.record) if outcome else ("", b"")
        args: list[EncodableT] = [
            ticket,
            token,
            limit,
            self.dispatch_timeout_ms,
            self.idle_horizon_ms,
            task_id,
            record,
            int(block),
        ]
        [reply] = self._pipelined(
            "finish",
            [([*names.all(), names.outcomes], args)],
            index=key,
            also=[("SADD", BLOCKED_KEYS, key)] if block else (),
        )
        result = FinishResult(Code(reply[0]), self._grants(key, reply[1:]))
        logger.debug(
            "finish key=%r ticket=%s code=%s granted=%s",
            key,
            ticket,
            result.code.name,
            [g.ticket for g in result.granted],
        )
        return result

    def retry(self, key: str, ticket: int, token: int, message: bytes, *, countdown_seconds: float) -> int | None:
        """Keep ``ticket``'s slot through a retry; returns the retry's dispatch, None if fenced."""
        names = KeyNames(key)
        code, dispatch = self._call(
            "retry",
            [names.messages, names.holders],
            [ticket, token, seconds_to_ms(countdown_seconds), self.dispatch_timeout_ms, message, ""],
        )
        logger.debug("retry key=%r ticket=%s code=%s dispatch=%s", key, ticket, Code(code).name, dispatch)
        return int(dispatch) if code == Code.OK else None

    def requeue(self, key: str, ticket: int, token: int) -> bool:
        """A running ticket's message goes back to the broker (``Reject(requeue=True)``): the same
        message may start the ticket again, which keeps its slot meanwhile. False if fenced.

        If that delivery never comes, the dispatch timeout publishes the stored message again.
        """
        names = KeyNames(key)
        code, _ = self._call(
            "retry", [names.messages, names.holders], [ticket, token, 0, self.dispatch_timeout_ms, "", "1"]
        )
        logger.debug("requeue key=%r ticket=%s code=%s", key, ticket, Code(code).name)
        return bool(code == Code.OK)

    def cancel(
        self,
        key: str,
        ticket: int,
        *,
        limit: int | None = None,
        forget: bool = False,
        failed: bool = False,
        dispatch: int | None = None,
        task_id: str | None = None,
        failed_for_good: bool = False,
    ) -> FinishResult:
        """Withdraw a ticket that has not started; returns tickets granted in its place.

        ``limit`` None: the key's own, as its submissions set it. ``dispatch`` and ``task_id``
        name the attempt withdrawn: a ticket not granted with that dispatch, or whose stored
        message is another task's, is left as it is (``Code.NOT_GRANTED``). ``failed_for_good``:
        its task failed without starting; a granted ticket whose stored message says its task
        blocks its key on failure is blocked instead (``Code.BLOCKED``).

        ``failed=True`` is for a submission that failed: its record is dropped if
        its row is not written yet. ``forget=True`` (implies ``failed``) when it failed
        before anyone saw its ticket: the ticket number is given back when it was the last one taken.
        """
        names = KeyNames(key)
        keys = [*names.all(), names.recent, names.recent_older, names.unwritten]
        args: list[EncodableT] = [
            ticket, "" if limit is None else limit, self.dispatch_timeout_ms, self.idle_horizon_ms,
            int(forget), int(failed or forget), "" if dispatch is None else dispatch, task_id or "",
            int(failed_for_good),
        ]  # fmt: skip
        # A ticket blocked now is listed among blocked_keys() in the same round trip, as finish's.
        listed: list[Command] = [("SADD", BLOCKED_KEYS, key)] if failed_for_good else []
        [reply] = self._pipelined("cancel", [(keys, args)], index=key, also=listed)
        result = FinishResult(Code(reply[0]), self._grants(key, reply[1:]))
        logger.debug("cancel key=%r ticket=%s code=%s", key, ticket, result.code.name)
        return result

    def unblock(self, key: str, ticket: int, *, retry: bool) -> FinishResult:
        """Act on the ticket that blocks ``key``: run it again at the head of the queue (``retry``: the
        ticket itself is returned, with its next dispatch), or withdraw it (the tickets granted in its
        place are returned). ``Code.NOT_GRANTED`` if it does not block the key."""
        reply = self._call_and_index(
            "unblock", key, KeyNames(key).all(), [ticket, int(retry), self.dispatch_timeout_ms, self.idle_horizon_ms]
        )
        result = FinishResult(Code(reply[0]), self._grants(key, reply[1:]))
        if result.code is Code.OK:
            self.client.srem(BLOCKED_KEYS, key)
        logger.debug("unblock key=%r ticket=%s retry=%s code=%s", key, ticket, retry, result.code.name)
        return result

    def give_up(self, key: str, ticket: int, dispatch: int, *, grace_seconds: float) -> bool:
        """Give up the attempt of ``ticket`` started by the message of ``dispatch``, whose process is
        being killed: fenced now, failed by the reaper without a recovery once ``grace_seconds`` have
        passed. False if that attempt does not run (it ended, or another dispatch replaced it)."""
        names = KeyNames(key)
        grace_ms = seconds_to_ms(grace_seconds)
        [(code, _)] = self._pipelined(
            "give_up",
            [([names.meta, names.holders], [ticket, grace_ms, dispatch])],
            index=key,
            index_within_ms=grace_ms,
        )
        logger.debug("give_up key=%r ticket=%s code=%s", key, ticket, Code(code).name)
        return Code(code) is Code.OK

    def renew(self, leases: Iterable[Lease]) -> dict[Lease, bool]:
        """Extend many leases in one round trip (one script call per key, pipelined)."""
        by_key: dict[str, list[Lease]] = {}
        for lease in leases:
            by_key.setdefault(lease.key, []).append(lease)
        if not by_key:
            return {}
        calls = [
            ([KeyNames(key).holders], [self.lease_ms, *(v for lease in held for v in (lease.ticket, lease.token))])
            for key, held in by_key.items()
        ]
        outcome: dict[Lease, bool] = {}
        for held, reply in zip(by_key.values(), self._pipelined("renew", calls), strict=True):
            outcome.update({lease: bool(ok) for lease, ok in zip(held, reply, strict=True)})
        return outcome

    def overdue_keys(self, seconds: float, *, limit: int = 1000) -> list[str]:
        """Keys that have needed the reaper for longer than ``seconds`` (none, while it runs); at most ``limit``."""
        due = self._server_time_ms() - seconds_to_ms(seconds)
        return [_text(m) for m in self._index_range(due, num=limit)]

    def pause(self, key: str, *, by: str = "") -> None:
        """Grant nothing more on ``key``: running tasks finish, submissions queue in order. ``by`` (who
        paused it) and the time are kept for the operator who finds the key paused."""
        # Listed first, so that every paused key is listed (a listed key may have failed to pause).
        self.client.sadd(PAUSED_KEYS, key)
        self._call(
            "pause", KeyNames(key).all(), [1, self.dispatch_timeout_ms, self.idle_horizon_ms, by[:PAUSED_BY_MAX]]
        )
        logger.debug("pause key=%r", key)

    def resume(self, key: str) -> list[Grant] | None:
        """Let ``key`` grant again; returns the tickets granted at once, to be published, or None if the key
        was not paused (two racing resumes: one resumes it, the other is told so)."""
        reply = self._call_and_index(
            "pause", key, KeyNames(key).all(), [0, self.dispatch_timeout_ms, self.idle_horizon_ms]
        )
        self.client.srem(PAUSED_KEYS, key)
        logger.debug("resume key=%r code=%s", key, Code(reply[0]).name)
        return None if reply[0] == Code.NOT_PAUSED else self._grants(key, reply[1:])

    def is_paused(self, key: str) -> bool:
        """Whether :meth:`pause` paused ``key`` and :meth:`resume` did not resume it since."""
        return bool(self.client.sismember(PAUSED_KEYS, key))

    def paused_keys(self, *, limit: int | None = None) -> list[str]:
        """The keys paused by :meth:`pause` and not resumed since; at most ``limit`` of them, read in steps."""
        return self._listed(PAUSED_KEYS, limit)

    def blocked_keys(self, *, limit: int | None = None) -> list[str]:
        """The keys a failed ticket blocks (see :meth:`finish`); at most ``limit`` of them.

        Listed when a ticket that may block failed, and checked here: a key listed but not
        blocked (its finish was fenced, or it was unblocked meanwhile) is taken off the list.
        """
        listed = self._listed(BLOCKED_KEYS, limit)
        blocked = [s.key for s in self.inspect_many(listed, waiting_shown=0) if s.blocked is not None]
        if stale := set(listed) - set(blocked):
            self.client.srem(BLOCKED_KEYS, *stale)
        return blocked

    def _listed(self, name: str, limit: int | None) -> list[str]:
        """The members of the SET ``name``, sorted; at most ``limit`` of them, read in steps."""
        if limit is None:
            return sorted(_text(member) for member in self.client.smembers(name))
        found: list[str] = []
        for member in self.client.sscan_iter(name, count=min(limit, 1000)):
            found.append(_text(member))
            if len(found) == limit:
                break
        return sorted(found)

    def refuse_join(self, key: str, task_id: str, *, due_in_seconds: float = 0.0) -> bool:
        """Make sure the delayed task ``task_id`` never joins ``key``'s queue.

        False if it already joined (it has a ticket: cancel that instead).
        """
        due_ms = self._server_time_ms() + seconds_to_ms(due_in_seconds) if due_in_seconds > 0 else 0
        [code] = self._call("refuse_join", [KeyNames(key).joined], [task_id, due_ms, self.idle_horizon_ms])
        logger.debug("refuse join key=%r task_id=%s code=%s", key, task_id, Code(code).name)
        return Code(code) is Code.OK

    def claim_unwritten(self, *, claim_seconds: float, batch: int = 500) -> list[tuple[str, int]]:
        """Claim up to ``batch`` keys holding submission records not yet written, for ``claim_seconds``;
        on a cluster, up to ``batch / shards`` (rounded up) of each shard of the unwritten index.

        Returns (key, claim) pairs; other callers pass a claimed key by until
        :meth:`forget_unwritten` releases it or the claim lapses.
        """
        shards = self.unwritten_index.names
        args: list[EncodableT] = [seconds_to_ms(claim_seconds), -(-batch // len(shards))]  # a share of each shard's
        replies = self._pipelined("claim_unwritten", [([shard], args) for shard in shards])
        return [(_text(flat[i]), int(flat[i + 1])) for flat in replies for i in range(0, len(flat), 2)]

    def unwritten(self, keys: Sequence[str], *, per_key: int = UNWRITTEN_PER_KEY) -> UnwrittenRecords:
        """The submission records kept for ``keys``, with their tickets' messages, in one round trip: about
        ``per_key`` of each key (a bounded step of Redis' work); ``more`` names the keys that keep others."""
        calls: list[tuple[Sequence[str], Sequence[EncodableT]]] = [
            ([(names := KeyNames(key)).unwritten, names.messages, names.scan_cursors], [per_key, self.idle_horizon_ms])
            for key in keys
        ]
        found, more = [], set()
        for key, (left, *flat) in zip(keys, self._pipelined("unwritten", calls), strict=True):
            if left:
                more.add(key)
            for ticket, kept, message in zip(flat[0::3], flat[1::3], flat[2::3], strict=True):
                parts = kept.split(b"|", 2)
                # Not as submit keeps it (someone else wrote it): handed on whole, for the caller to refuse.
                state, at_ms, record = parts if len(parts) == 3 and parts[1].isdigit() else (b"", b"0", kept)
                found.append(Unwritten(key, int(ticket), state == b"d", int(at_ms), record, message or None))
        return UnwrittenRecords(found, frozenset(more))

    def unclaim_unwritten(self, claims: Iterable[tuple[str, int]]) -> None:
        """Give back ``claims`` (from :meth:`claim_unwritten`) whose records were not written: due again at once."""
        if calls := _reindex_calls(self.unwritten_index, ((key, claim, 0) for key, claim in claims)):
            self._pipelined("reindex", calls)

    def forget_unwritten(self, written: Iterable[Unwritten], claims: Iterable[tuple[str, int]] = ()) -> None:
        """Delete records whose rows are written, and release ``claims`` (from :meth:`claim_unwritten`)
        of keys no submission was kept for since; one round trip."""
        # Deleted first (on one server; a cluster's masters each take theirs): a claim released before
        # its records were deleted would leave them unindexed, until the key's next submission.
        deleted: list[Command] = [("HDEL", KeyNames(w.key).unwritten, w.ticket) for w in written]
        released = _reindex_calls(self.unwritten_index, ((key, claim, -1) for key, claim in claims))  # -1: removed
        if released:
            self._pipelined("reindex", released, before=deleted)
        elif deleted:
            self._run(deleted)

    def forget_outcomes(self, written: Iterable[tuple[str, str]]) -> None:
        """Delete the outcomes of runs whose records are written: (key, task id) pairs, one round trip."""
        pipe = self.client.pipeline(transaction=False)
        for key, task_id in written:
            pipe.hdel(KeyNames(key).outcomes, task_id)
        if len(pipe):
            pipe.execute()

    def rebuild(self, key: str, *, last_ticket: int, waiting: list[tuple[int, bytes]], limit: int = 1) -> FinishResult:
        """Restore a key lost with Redis: ``waiting`` (ticket, message) pairs, oldest first.

        Returns the tickets granted at once; ``Code.EXISTS`` if the key has
        any state in Redis (nothing is changed then).
        """
        names = KeyNames(key)
        staged = names.staged(uuid.uuid4().hex)  # this rebuild's own: two racing rebuilds never mix
        for start in range(0, len(waiting), REBUILD_CHUNK):
            chunk: list[EncodableT] = [seconds_to_ms(STAGING_SECONDS)]
            for ticket, message in waiting[start : start + REBUILD_CHUNK]:
                chunk += [ticket, message]
            self._call("stage_rebuild", staged, chunk)
        args: list[EncodableT] = [last_ticket, limit, self.dispatch_timeout_ms]
        reply = self._call_and_index("rebuild", key, [*names.all(), *staged], args)
        return FinishResult(Code(reply[0]), self._grants(key, reply[1:]))

    def holds(self, lease: Lease) -> bool:
        """True while ``lease`` is the running holder of its ticket (not fenced)."""
        raw = self.client.hget(KeyNames(lease.key).holders, lease.ticket)
        if raw is None:
            return False
        holder = _decode_holder(raw, now_ms=0)  # its deadline is not read
        return holder.state == "running" and holder.token == lease.token

    def reap(self, *, batch: int = 500, dry_run: bool = False) -> tuple[int, list[Recovery]]:
        """Recover the holders whose deadline passed, over up to ``batch`` due keys.

        Two round trips for the whole batch (one pipelined script per due key,
        then one index update), plus one to read the due keys. Safe to run
        from several processes at once: each recovery is one atomic script.
        Returns how many due keys were visited, and the recoveries.
        """
        now_ms = self._server_time_ms()
        due = self._index_range_with_scores(now_ms, num=batch)
        return len(due), self._visit(due, now_ms, dry_run=dry_run)

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
        republish_before: int | str = "",
    ) -> list[Recovery]:
        """Run the reap script on each (key, index score) and move each key to its next deadline."""
        if not due:
            return []
        calls = [self._reap_call(_text(m), dry_run=dry_run, republish_before=republish_before) for m, _ in due]
        replies = self._pipelined("reap", calls)
        recoveries: list[Recovery] = []
        moves: list[tuple[str, float, int]] = []
        longest_gap = min(self.lease_ms, self.dispatch_timeout_ms)
        for (member, seen), reply in zip(due, replies, strict=True):
            next_deadline = int(reply[0])
            recoveries += self._recoveries(_text(member), reply)
            # Look again at the key's next deadline, and at least that often while it has holders.
            moves.append((_text(member), seen, -1 if next_deadline < 0 else min(next_deadline, now_ms + longest_gap)))
        if not dry_run:
            if blocked := {r.key for r in recoveries if r.action is RecoveryAction.BLOCK}:
                self.client.sadd(BLOCKED_KEYS, *blocked)
            self._pipelined("reindex", _reindex_calls(self.deadlines, moves))
        for r in recoveries:
            logger.debug("reap key=%r ticket=%s action=%s dry_run=%s", r.key, r.ticket, r.action, dry_run)
        return recoveries

    def republish_soon(self, key: str, ticket: int, dispatch: int, *, delay_seconds: float) -> bool:
        """The message of a granted ticket failed to publish: the reaper publishes it after ``delay_seconds``.

        False if the ticket is no longer granted with that dispatch (it started, ended, or moved on).
        """
        return self._republish_soon(key, ticket, dispatch, delay_seconds, count=False) is not None

    def undelivered(self, key: str, ticket: int, dispatch: int, *, delay_seconds: float) -> int | None:
        """A worker dropped the message of a granted ticket undelivered (it knows no such task): the reaper
        publishes it after ``delay_seconds``. How many times the ticket was dropped so, or None if it is no
        longer granted with that dispatch."""
        return self._republish_soon(key, ticket, dispatch, delay_seconds, count=True)

    def _republish_soon(self, key: str, ticket: int, dispatch: int, delay_seconds: float, *, count: bool) -> int | None:
        delay_ms = seconds_to_ms(delay_seconds)
        names = KeyNames(key)
        keys, args = [names.holders], [ticket, dispatch, delay_ms]
        if count:
            keys, args = [*keys, names.undelivered], [*args, self.idle_horizon_ms]
        [(code, *drops)] = self._pipelined("republish_soon", [(keys, args)], index=key, index_within_ms=delay_ms)
        logger.debug("republish_soon key=%r ticket=%s code=%s", key, ticket, Code(code).name)
        return int(drops[0]) if Code(code) is Code.OK else None

    def release(self, key: str, ticket: int, *, dispatch: int | None = None) -> list[Recovery]:
        """Recover ``ticket``'s holder now, as the reaper does when its deadline passes.

        A running holder is fenced and re-dispatched (or failed, past its
        recoveries); a granted one is published again, with its next dispatch. Any
        other due holder of the key is recovered too. With ``dispatch``, only that
        dispatch of the ticket is released: a second release of it finds it moved on.
        The ticket is among the recoveries only if it was released.
        """
        call = self._reap_call(key, release=ticket, released_dispatch="" if dispatch is None else dispatch)
        [reply] = self._pipelined("reap", [call], index=key)
        return self._recoveries(key, reply)

    def _reap_call(
        self,
        key: str,
        *,
        dry_run: bool = False,
        release: int | str = "",
        republish_before: int | str = "",
        released_dispatch: int | str = "",
    ) -> tuple[list[str], list[EncodableT]]:
        names = KeyNames(key)
        args: list[EncodableT] = [self.dispatch_timeout_ms, self.idle_horizon_ms, int(dry_run), self.outcome_grace_ms]
        return [*names.all(), names.outcomes, names.scan_cursors], [*args, release, republish_before, released_dispatch]

    @staticmethod
    def _recoveries(key: str, reply: list[Any]) -> list[Recovery]:
        flat = reply[1:]
        return [
            Recovery(
                key, RecoveryAction(flat[i].decode()), int(flat[i + 1]), int(flat[i + 2]), int(flat[i + 3]), flat[i + 4]
            )
            for i in range(0, len(flat), 5)
        ]

    def _pipelined(
        self,
        name: str,
        calls: Sequence[tuple[Sequence[str], Sequence[EncodableT]]],
        *,
        index: str | Sequence[str] | None = None,
        index_within_ms: int | None = None,
        before: Sequence[Command] = (),
        also: Sequence[Command] = (),
    ) -> list[Any]:
        """Run script ``name`` once per (keys, args) in one round trip, loading it if Redis lost it.

        With ``index`` (a key, or several), also move those keys early in the deadline index
        (``ZADD LT``): to when a deadline ``index_within_ms`` from now falls due, by default the
        earliest a new holder's can. ``before`` and ``also``: more commands for the same round
        trip, sent first and last. The replies of the script's calls are returned.
        """
        script = self._scripts[name]
        commands: list[Command] = [*before, *(("EVALSHA", script.sha, len(keys), *keys, *args) for keys, args in calls)]
        if index is not None:
            indexed = [index] if isinstance(index, str) else index
            commands += _index_commands(self.deadlines, indexed, self._deadline_hint_ms(index_within_ms), "LT")
        return self._run([*commands, *also], script)[len(before) : len(before) + len(calls)]

    def _run(self, commands: Sequence[Command], script: Script | None = None) -> list[Any]:
        """Send ``commands`` in one round trip and raise the first error reply; if Redis lost ``script``
        (a restart, or a cluster node that never had it), load it and send again the calls it refused."""
        replies = self._transport.round_trip(commands)
        refused = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if refused and script is not None:
            script.sha = self.client.script_load(script.script)  # on a cluster, on every master
            for i, reply in zip(refused, self._transport.round_trip([commands[i] for i in refused]), strict=True):
                replies[i] = reply
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return replies

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
        due = [pair for reply in replies for pair in _scored(reply)]
        if len(replies) > 1:
            due.sort(key=lambda pair: pair[1])
        return due if num is None else due[:num]

    def _server_time_ms(self) -> int:
        seconds, micros = self.client.time()
        return seconds * 1000 + micros // 1000

    def inspect(self, key: str, *, waiting_shown: int | None = None) -> KeySnapshot:
        """A read-only snapshot of one key, a ``KeySnapshot`` (several reads in one pipelined round trip)."""
        return self.inspect_many([key], waiting_shown=waiting_shown)[0]

    def waiting_ahead(self, key: str, ticket: int) -> int | None:
        """How many tickets wait ahead of ``ticket`` in ``key``'s queue; None if it does not wait there.
        One ``LPOS``: it reads the queue up to the ticket."""
        position = self.client.lpos(KeyNames(key).queue, str(ticket))
        return None if position is None else int(position)  # type: ignore[arg-type]  # redis-py types it loosely

    def inspect_many(self, keys: Sequence[str], *, waiting_shown: int | None = None) -> list[KeySnapshot]:
        """Snapshots of many keys, one ``KeySnapshot`` per key in order, in one pipelined round trip.

        ``waiting`` lists the oldest ``waiting_shown`` waiting tickets (all with None);
        ``depth`` counts them all. ``holders`` maps each ticket holding a slot (at most the
        key's limit) to its ``Holder``: its state, ``running`` or ``granted``, its dispatch,
        token, attempts and lost leases, and the seconds left before its deadline.
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
                    holders={int(t): _decode_holder(raw, now_ms) for t, raw in holders.items()},
                    messages=messages,
                    idle_expires_in=ms_to_seconds(ttl_ms) if ttl_ms >= 0 else None,
                )
            )
        return snapshots

    def _grants(self, key: str, flat: list[Any]) -> list[Grant]:
        return [Grant(key, int(flat[i]), int(flat[i + 1]), flat[i + 2]) for i in range(0, len(flat), 3)]


def _ms_since(value: bytes | None, now_ms: int) -> float | None:
    """Seconds from a server-clock ms value to ``now_ms``; None if there is none (or it is not a number)."""
    return ms_to_seconds(now_ms - int(value)) if value and value.isdigit() else None


def _paused_since(value: bytes | None) -> float | None:
    """When a key was paused (seconds since the epoch, server clock); None if it is not, or if an earlier
    version of the app paused it (it kept 1, no time)."""
    since = int(value) / 1000 if value and value.isdigit() else 0
    return since if since > 1 else None


def _index_commands(index: Index, keys: Iterable[str], score: int, *flags: str) -> list[Command]:
    """``ZADD`` commands scoring ``keys`` ``score`` in ``index``, one per shard that holds any; none for no key."""
    by_shard: dict[str, list[EncodableT]] = {}
    for key in dict.fromkeys(keys):
        by_shard.setdefault(index.shard_of(key), []).extend((score, key))
    return [("ZADD", shard, *flags, *scored) for shard, scored in by_shard.items()]


def _reindex_calls(
    index: Index, moves: Iterable[tuple[str, float, int]]
) -> list[tuple[Sequence[str], Sequence[EncodableT]]]:
    """``reindex.lua``'s calls moving each (key, score read, next score) in ``index``, one per shard."""
    by_shard: dict[str, list[EncodableT]] = {}
    for key, seen, next_score in moves:
        # The score as Redis wrote it: a float index score read back whole prints without ".0".
        read = repr(seen) if seen != int(seen) else int(seen)
        by_shard.setdefault(index.shard_of(key), []).extend((key, read, next_score))
    return [([shard], args) for shard, args in by_shard.items()]


def _scored(reply: list[Any]) -> list[tuple[bytes | str, float]]:
    """A ``WITHSCORES`` reply as (member, score) pairs: RESP3 sends pairs, RESP2 one flat list."""
    if reply and isinstance(reply[0], list):
        return [(member, float(score)) for member, score in reply]
    return [(reply[i], float(reply[i + 1])) for i in range(0, len(reply), 2)]


def _text(reply: bytes | str) -> str:
    """A reply as text (the gate's client reads bytes; redis-py's annotations allow either)."""
    return reply.decode() if isinstance(reply, bytes) else reply


def _decode_holder(raw: bytes | str, now_ms: int) -> Holder:
    """A holder record (``lua/includes/common.lua`` describes it); its deadline made relative to ``now_ms``."""
    state, dispatch, token, deadline, attempts, lost, max_lost, *block = _text(raw).split("|")
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


_HOLDER_STATES: dict[str, HolderState] = {"r": "running", "g": "granted", "b": "blocked"}


__all__ = ["Gate", "NotSent", "ReplicasBehind"]
