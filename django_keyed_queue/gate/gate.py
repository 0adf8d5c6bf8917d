"""The gate's one front door: ``Gate``, one atomic Lua call per state transition of a ticket.

``Gate`` is one class, and this file holds all of it: its client and durations, the one runner that
sends every script (``_pipelined``), and one method per call its users make, grouped by who makes it.
A method builds its script's arguments with the builder of the transition's module beside the script
(``start.call`` beside ``lua/start.lua``), sends them, and reads the reply with that module's parser;
the modules of a concern hold the rest (``pools.py`` the pools' types and builders, ``inspection.py``
the holder record's parser, ``reaping.py`` the rebuild's, ``unwritten.py`` the records', ``listing.py``
the listing's results).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import redis
from redis.cluster import RedisCluster
from redis.commands.core import Script
from redis.exceptions import NoScriptError
from redis.typing import EncodableT

from . import cancel as cancelling
from . import finish as finishing
from . import newer_waiting as newer
from . import override as overriding
from . import pause as pausing
from . import reap, submit
from . import refuse_join as refusing_join
from . import renew as renewing
from . import republish_soon as republishing
from . import requeue as requeueing
from . import retry as retrying
from . import run_now as running_now
from . import start as starting
from . import stop as stopping
from . import unblock as unblocking
from . import wait_to_start as waiting_to_start
from .base import grants, index_commands, reindex_calls, scored, text, texts
from .calls import ScriptCall
from .cancel import Cancel
from .finish import Finish
from .inspection import decode_holder, key_snapshot, stored_task_id
from .keys import (
    BLOCKED_KEYS,
    CLUSTER_INDEX_SHARDS,
    DEADLINE_INDEX,
    OVERRIDDEN_KEYS,
    PAUSED_KEYS,
    POOLS,
    TOTALS,
    TOTALS_TEMPLATES,
    UNWRITTEN_INDEX,
    Index,
    KeyNames,
    PoolNames,
    member_ticket,
    pool_member,
)
from .listing import SCAN_STEP, IndexedKeys, MatchedKeys
from .override import UNCHANGED, Unchanged, override_value
from .pools import (
    HOLD_MARGIN_MS,
    Pool,
    PoolAcquired,
    PoolSnapshot,
    granted_recovery,
    pool_acquire_call,
    pool_granted_call,
    pool_override_call,
    pool_release_call,
    pool_renew_call,
    pool_wait_call,
)
from .pushes import Pushes, username
from .reap import Reap
from .reaping import REBUILD_CHUNK, STAGING_SECONDS, rebuild_call, restore_ahead_call, stage_rebuild_call
from .results import (
    FinishResult,
    Grant,
    KeySnapshot,
    Lease,
    Overridden,
    QueueFull,
    Recovery,
    RecoveryAction,
    RestoredAhead,
    StartResult,
    Stopping,
    SubmitResult,
    Unwritten,
    UnwrittenRecords,
)
from .scripts import SCRIPT_NAMES, Code, ms_to_seconds, seconds_to_ms, source
from .start import Start
from .submit import Submission
from .transport import Command, NotSent, ReplicasBehind, Replication, transport_for
from .unwritten import UNWRITTEN_PER_KEY, claim_unwritten_call, replacement_call, unwritten_call

logger = logging.getLogger(__name__)

#: How many times a start asked apart of its pool asks again if its slot went back before its key's start.
POOL_TRIES = 3


class Gate:
    """Per-key FIFO of tickets in Redis; at most ``limit`` tickets of a key hold a slot.

    Every method is one script call (one round trip) unless it says otherwise. Durations are seconds
    at this API and milliseconds inside Redis. Made with a Redis client (of one server, or of a Redis
    Cluster) and the durations ``__init__`` takes: lease, dispatch timeout, idle horizon, outcome
    grace, record delay, and the replicas each write waits for.

    Keys that may need the reaper are found through a sorted set, the deadline index (logical key ->
    when to look); on a Redis Cluster it is split in shards (see :class:`~.keys.Index`). It is not in
    the keys' slots, so the scripts cannot write it: each call that can create a holder sends a
    ``ZADD LT`` of an early estimate in the same round trip (``index=`` of :meth:`_pipelined`), and
    the reaper, after visiting a key, moves it to the key's real next deadline. The unwritten index
    (keys holding submission records not yet written to the database) is kept the same way.
    """

    # ---- The client, the durations in ms, the indexes, and the one script runner.

    def __init__(
        self,
        client: redis.Redis | RedisCluster,
        *,
        lease_seconds: float = 60.0,
        dispatch_timeout_seconds: float = 300.0,
        idle_horizon_seconds: float = 86400.0,
        outcome_grace_seconds: float = 10.0,
        record_delay_seconds: float = 0.0,
        wait_replicas: int = 0,
        wait_timeout_seconds: float = 1.0,
    ) -> None:
        self.client = client
        self.lease_ms = seconds_to_ms(lease_seconds)
        self.dispatch_timeout_ms = seconds_to_ms(dispatch_timeout_seconds)
        self.idle_horizon_ms = seconds_to_ms(idle_horizon_seconds)
        #: How long a finished run's outcome may wait for its worker to write the record.
        self.outcome_grace_ms = seconds_to_ms(outcome_grace_seconds)
        #: How old a submission's record gets before a writer's pass writes its row (``claim_unwritten``):
        #: a run that ends within it writes its row once, in its final state.
        self.record_delay_ms = seconds_to_ms(record_delay_seconds)
        self._scripts = {name: client.register_script(source(name)) for name in SCRIPT_NAMES}
        self._transport = transport_for(client, Replication(wait_replicas, seconds_to_ms(wait_timeout_seconds)))
        shards = CLUSTER_INDEX_SHARDS if isinstance(client, RedisCluster) else 1
        self.deadlines = Index(DEADLINE_INDEX, shards)
        self.unwritten_index = Index(UNWRITTEN_INDEX, shards)
        #: Reads whether each grant's message was pushed, and tells a refused push (once per cause).
        self.pushes = Pushes(username(client))
        #: The pools this gate has named among the pools (``keys.POOLS``) that the reaper's pass visits.
        self.named_pools: set[str] = set()

    def _call(self, call: ScriptCall) -> Any:
        """Run one script call; its reply."""
        return self._pipelined([call])[0]

    def _call_and_index(self, call: ScriptCall, key: str) -> list[Any]:
        """Run a script call that may create a holder of ``key``, and index the key, in one round trip."""
        reply: list[Any] = self._pipelined([call], index=key)[0]
        return reply

    def _pipelined(
        self,
        calls: Sequence[ScriptCall],
        *,
        index: str | Sequence[str] | None = None,
        index_within_ms: int | None = None,
        before: Sequence[Command] = (),
        also: Sequence[Command] = (),
    ) -> list[Any]:
        """Run ``calls`` (all of one script, each from its script's builder: see ``calls.py``) in one round trip,
        loading the script if Redis lost it.

        With ``index`` (a key, or several), also move those keys early in the deadline index
        (``ZADD LT``): to when a deadline ``index_within_ms`` from now falls due, by default the
        earliest a new holder's can. ``before`` and ``also``: more commands for the same round
        trip, sent first and last. The replies of the script's calls are returned.
        """
        names = {call.script for call in calls}
        if len(names) > 1:  # a lost script is loaded again for the calls it refused: one script a trip
            raise ValueError(f"one round trip runs one script, not {sorted(names)}")
        script = self._scripts[names.pop()] if names else None
        commands: list[Command] = [*before]
        if script is not None:
            commands += [("EVALSHA", script.sha, len(keys), *keys, *args) for _, keys, args in calls]
        if index is not None:
            indexed = [index] if isinstance(index, str) else index
            commands += index_commands(self.deadlines, indexed, self._deadline_hint_ms(index_within_ms))
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

    def _deadline_hint_ms(self, within_ms: int | None = None) -> int:
        # A holder created now has a deadline no earlier than ``within_ms`` from now (by default the
        # shortest a new holder can have), on a clock within a second of this host's; looking early
        # only costs a visit.
        if within_ms is None:
            within_ms = min(self.lease_ms, self.dispatch_timeout_ms)
        return int(time.time() * 1000) + within_ms - 1000

    def _index_unwritten(self, keys: Iterable[str]) -> list[Command]:
        """The commands scoring ``keys`` in the unwritten index (records kept for them) due after the record
        delay, unless due sooner already (``LT``: a key's first record decides, and a writer's claim made
        meanwhile is released keeping the key); none for no key. On this host's clock, as the deadline hint."""
        return index_commands(self.unwritten_index, keys, int(time.time() * 1000) + self.record_delay_ms)

    def _server_time_ms(self) -> int:
        seconds, micros = self.client.time()
        return seconds * 1000 + micros // 1000

    # ---- A ticket's life, the producers' and workers' calls on the hot path: submit, start, renew, retry,
    # requeue, finish, cancel, unblock and stop.

    def submit(self, submission: Submission, *, retried: bool = False) -> SubmitResult | None:
        """Take the next ticket of ``submission.key`` and keep its message, in one round trip.

        None for a join seen before (nothing changed); raises ``QueueFull``, taking nothing, for a key at
        its ``max_waiting``. ``retried=True`` after a call whose reply was lost: the ticket its task id
        took, if it still holds exactly its message, is returned as it stands and none is taken (found
        for at least ``submit.RECENT_SUBMISSION_SECONDS``).
        """
        recorded = [submission.key] if submission.record or submission.coalesce else []  # a superseded one's too
        call = submit.call(submission, self, retried=retried)
        [reply] = self._pipelined([call], index=submission.key, also=self._index_unwritten(recorded))
        result = submit.parse(submission, reply, self.pushes.pushed)
        if isinstance(result, QueueFull):
            raise result
        return result

    def submit_many(
        self, submissions: Sequence[Submission], *, retried: bool = False
    ) -> list[SubmitResult | QueueFull]:
        """Submit each of ``submissions`` as :meth:`submit` does, in order, in one round trip (none joins).

        A key at its ``max_waiting`` gets its ``QueueFull`` in the list, and no ticket.
        """
        if not submissions:
            return []
        if any(s.join_id for s in submissions):
            raise ValueError("submit_many takes submissions, not joins (a join may be a duplicate)")
        batch = [submit.call(s, self, retried=retried) for s in submissions]
        recorded = [s.key for s in submissions if s.record or s.coalesce]
        replies = self._pipelined(batch, index=[s.key for s in submissions], also=self._index_unwritten(recorded))
        results: list[SubmitResult | QueueFull] = []
        for s, reply in zip(submissions, replies, strict=True):
            result = submit.parse(s, reply, self.pushes.pushed)
            assert result is not None  # no join: never a duplicate
            results.append(result)
        return results

    def start(self, start: Start) -> StartResult:
        """Check the message of ``start.dispatch`` may run ``start.ticket`` and start its lease (see
        ``start.Start``).

        A pooled start asks its pool in the same call on one server, apart on a Redis Cluster
        (:meth:`start_after_pool`). ``StartResult.granted``: tickets a slot the pool freed meanwhile went
        to, to publish.
        """
        pool = start.pool
        if pool is not None and self.pools_apart:
            acquired = self.pool_acquire(pool, start.key, start.ticket)
            started = self.start_after_pool(acquired, start)
            return replace(started, granted=[*acquired.granted, *started.granted])
        # Indexed too: this process's lease may be shorter than the one the granting process assumed. A pool is
        # named among the pools once per gate, for the reaper's pass (its start and finish never name it).
        also = [("SADD", POOLS, pool.name)] if pool is not None and pool.name not in self.named_pools else []
        [reply] = self._pipelined([starting.call(start, self, pool_here=True)], index=start.key, also=also)
        if pool is not None:
            self.named_pools.add(pool.name)
        return starting.parse(start, reply, self.pool_grants)

    def start_after_pool(self, acquired: PoolAcquired, start: Start, *, tries: int = POOL_TRIES) -> StartResult:
        """The rest of a start whose pool was asked apart (a Redis Cluster), once the pool said ``acquired``:
        it waits for its pool, waits for the pool's rate, or its key is asked. Its ``granted`` are the
        tickets given slots after that answer (``acquired.granted`` are the caller's to publish).

        Other calls may come between the pool's answer and the key's. A slot given to a message its key refuses
        goes where the pool meant it: to the ticket (published again) while it holds its key, else on. The slot
        is checked once the key has started the ticket: a start whose slot went back meanwhile (a copy of its
        message ran and was requeued; its slot expired) is undone and the pool asked again, ``tries`` times."""
        key, ticket, dispatch, pool = start.key, start.ticket, start.dispatch, start.pool
        if pool is None:
            raise ValueError("start_after_pool: the start names no pool")
        if acquired.code is Code.PARKED:
            self.pool_wait(key, ticket, dispatch, pool=pool.name)
            return StartResult(Code.PARKED)
        if acquired.code is Code.TOO_EARLY:
            stored = self.client.hget(KeyNames(key).messages, ticket)
            message = stored.encode() if isinstance(stored, str) else stored
            # Its dispatch deadline moves past then, so that the reaper publishes no copy sooner.
            delay_ms = seconds_to_ms(acquired.wait_seconds) + self.lease_ms
            move = republishing.call(key, ticket, dispatch, delay_ms=delay_ms, later=True)
            self._pipelined([move], index=key, index_within_ms=delay_ms)
            return StartResult(Code.TOO_EARLY, wait_seconds=acquired.wait_seconds, message=message)
        [reply] = self._pipelined([starting.call(start, self, pool_here=False)], index=key)
        started = starting.parse(start, reply, self.pool_grants)
        if started.ok:
            lease = Lease(key, ticket, started.token)
            if self.pool_renew(pool.name, [lease])[lease]:
                return started
            self.requeue(lease, unstarted=True)
            if tries <= 1:  # its message is dropped: the reaper publishes the ticket again at its dispatch timeout
                logger.warning("key=%r ticket=%s lost its pool slot at each of %d starts", key, ticket, POOL_TRIES)
                return StartResult(Code.NOT_GRANTED)
            again = self.pool_acquire(pool, key, ticket)
            retried = self.start_after_pool(again, start, tries=tries - 1)
            return replace(retried, granted=[*again.granted, *retried.granted])
        if started.code is Code.NOT_GRANTED or (acquired.given and started.code is not Code.ALREADY_STARTED):
            return replace(started, granted=self.pool_granted(pool.name, [pool_member(key, ticket)]))
        return started

    def wait_to_start(self, key: str, ticket: int, dispatch: int, *, interval_ms: int) -> tuple[float, bytes | None]:
        """Seconds before the message of ``dispatch`` may start ``ticket`` under a rate of one start per
        ``interval_ms`` on ``key``, and the ticket's stored message if it must wait; (0.0, None) when it
        may start now, or may not start at all (:meth:`start` says why). A check, not a claim."""
        reply = self._call(waiting_to_start.call(key, ticket, dispatch, self, interval_ms=interval_ms))
        return waiting_to_start.parse(reply)

    def finish(self, finish: Finish) -> FinishResult:
        """End a running ticket and grant the next ones; their messages are returned (each pushed to the
        broker already where the producer left a template: ``Grant.pushed``). See ``finish.Finish``.

        On one server a kept grant started here asks its pool here too (after the pool's line was served);
        on a Redis Cluster a pooled finish starts no kept grant, and its pool's slot goes back in a call of
        its own.
        """
        here = finish.pool is not None and not self.pools_apart
        if finish.pool is not None and not here:
            finish = replace(finish, start_kept=None)  # its pool is apart: the kept grant's own start asks it
        # A kept grant's deadline may be sooner than the index's hint: index it by then.
        within = seconds_to_ms(finish.keep_first_seconds) if finish.keep_first_seconds > 0 else None
        blocked: list[Command] = [("SADD", BLOCKED_KEYS, finish.key)] if finish.block else []
        call = finishing.call(finish, self, pool_here=here)
        [reply] = self._pipelined([call], index=finish.key, index_within_ms=within, also=blocked)
        pool, member = finish.pool or "", (finish.key, finish.ticket)
        pool_grants = self.pool_grants if here else lambda _: self.pool_release(pool, [member])
        return finishing.parse(finish, reply, self.pushes.pushed, pool_grants)

    def kept_by(self, key: str, token: int) -> tuple[int, int] | None:
        """The (ticket, token) that the finish of the run holding ``token`` started for its caller, if it
        was the key's last such start: for a caller whose reply to that finish was lost."""
        raw = self.client.hget(KeyNames(key).meta, "kept")
        parts = text(raw).split("|") if raw else []
        if len(parts) != 3 or not all(p.isdigit() for p in parts) or int(parts[0]) != token:
            return None
        return int(parts[1]), int(parts[2])

    def retry(self, lease: Lease, message: bytes, *, countdown_seconds: float) -> int | None:
        """Keep ``lease``'s ticket's slot through a retry; returns the retry's dispatch, None if fenced."""
        return retrying.parse(lease, self._call(retrying.call(lease, message, countdown_seconds, self)))

    def requeue(self, lease: Lease, *, unstarted: bool = False) -> bool:
        """A running ticket's message goes back to the broker (``Reject(requeue=True)``): the same
        message may start the ticket again, which keeps its slot meanwhile. False if fenced.

        If that delivery never comes, the dispatch timeout publishes the stored message again.
        ``unstarted``: the attempt never ran (a kept grant ``finish`` started that goes by broker after
        all): it is not counted.
        """
        return requeueing.parse(lease, self._call(requeueing.call(lease, unstarted, self)))

    def cancel(self, cancel: Cancel) -> FinishResult:
        """Withdraw a ticket that has not started (see ``cancel.Cancel``); returns the tickets granted in
        its place."""
        # A ticket blocked now is listed among blocked_keys() in the same round trip, as finish's.
        listed: list[Command] = [("SADD", BLOCKED_KEYS, cancel.key)] if cancel.failed_for_good else []
        [reply] = self._pipelined([cancelling.call(cancel, self)], index=cancel.key, also=listed)
        return cancelling.parse(cancel, reply, self.pushes.pushed)

    def unblock(self, key: str, ticket: int, *, retry: bool) -> FinishResult:
        """Act on the ticket that blocks ``key``: run it again at the head of the queue (``retry``: the
        ticket itself is returned, with its next dispatch), or withdraw it (the tickets granted in its
        place are returned). ``Code.NOT_GRANTED`` if it does not block the key.

        Two round trips: the script, then, if it acted, the key is taken off :meth:`blocked_keys`.
        That list is one SET of its own (its own slot on a cluster), which no script of a key may
        touch, and it is taken off only if the script acted. Should the second call fail, the list
        keeps a key no longer blocked, which :meth:`blocked_keys` drops when it next reads it.
        """
        reply = self._call_and_index(unblocking.call(key, ticket, retry, self), key)
        result = unblocking.parse(key, ticket, retry, reply, self.pushes.pushed)
        if result.code is Code.OK:
            self.client.srem(BLOCKED_KEYS, key)
        return result

    def stop(self, key: str, ticket: int, dispatch: int, *, by: str, how: str) -> Stopping | None:
        """Stop the attempt of ``ticket`` started by the message of ``dispatch``: it is not recovered, and
        keeps its slot until it has ended (``release`` of that dispatch, once its process is gone, or its
        lease's end). ``by``: the operator ('' for Celery killing it: noted only if nobody stopped it);
        ``how``: what is done to its process. Who stopped it first; None if that attempt does not run."""
        return stopping.parse(key, ticket, self._call(stopping.call(key, ticket, dispatch, by=by, how=how)))

    def renew(self, leases: Iterable[Lease]) -> dict[Lease, bool]:
        """Extend many leases in one round trip (one script call per key, pipelined)."""
        by_key: dict[str, list[Lease]] = {}
        for lease in leases:
            by_key.setdefault(lease.key, []).append(lease)
        if not by_key:
            return {}
        batch = [renewing.call(key, held, self) for key, held in by_key.items()]
        outcome: dict[Lease, bool] = {}
        for held, reply in zip(by_key.values(), self._pipelined(batch), strict=True):
            outcome.update(renewing.parse(held, reply))
        return outcome

    # ---- A pooled ticket's slot of its pool (see pools.py): asked for at its start, renewed, given back, and
    # the line served.

    def pool_acquire(self, pool: Pool, key: str, ticket: int, *, starting: bool = True) -> PoolAcquired:
        """Ask ``pool`` for a slot for ``ticket`` of ``key``: OK (it holds one, and ``starting``, may start
        now), PARKED (it waits in the pool's line), or TOO_EARLY (the pool's rate: it holds its slot, and
        may start in ``wait_seconds``). ``starting``: a worker starts it now (its start counts for the rate,
        and the slot is held a lease); else the slot is held for its start, a dispatch timeout.

        One round trip, and one more per other ticket the pool gave a freed slot to."""
        call = pool_acquire_call(
            pool.name, member=pool_member(key, ticket), limit=pool.limit, interval_ms=pool.interval_ms,
            hold_ms=self.running_hold_ms if starting else self.dispatch_timeout_ms, starting=starting,
            grant_ms=self.dispatch_timeout_ms,
        )  # fmt: skip
        code, wait_ms, given, *others = self._pipelined([call], also=[("SADD", POOLS, pool.name)])[0]
        granted = self.pool_granted(pool.name, others)
        result = PoolAcquired(Code(code), ms_to_seconds(int(wait_ms)), granted, given=bool(int(given)))
        logger.debug("pool_acquire pool=%r key=%r ticket=%s: %s", pool.name, key, ticket, result.code.name)
        return result

    @property
    def pools_apart(self) -> bool:
        """A pool's slot is on another server than its tickets' keys (a Redis Cluster): it is asked in calls of
        its own. On one server, ``start`` and ``finish`` ask and give back in their own call."""
        return isinstance(self.client, RedisCluster)

    def pool_grants(self, flat: Sequence[Any]) -> list[Grant]:
        """Grants from a script's key, ticket, dispatch, message, pushed quintuples (``pool_here.lua``'s)."""
        return [
            Grant(
                text(flat[i]), int(flat[i + 1]), int(flat[i + 2]), flat[i + 3], pushed=self.pushes.pushed(flat[i + 4])
            )
            for i in range(0, len(flat), 5)
        ]

    @property
    def running_hold_ms(self) -> int:
        """How long a running ticket holds its pool slot from a start or a renew: its lease, and a margin."""
        return self.lease_ms + min(HOLD_MARGIN_MS, self.lease_ms)

    def pool_wait(self, key: str, ticket: int, dispatch: int, *, pool: str) -> bool:
        """The pool had no slot for ``ticket``, granted with ``dispatch``: it waits for its pool (no message of it
        starts until the pool gives it a slot). False if it moved on meanwhile (the pool gave it one already,
        and its key published it again; or it ended)."""
        call = pool_wait_call(key, ticket=ticket, dispatch=dispatch, pool=pool, ask_again_ms=self.dispatch_timeout_ms)
        code, _ = self._pipelined([call], index=key, index_within_ms=self.dispatch_timeout_ms)[0]
        return Code(code) is Code.OK

    def pool_release(self, pool: str, tickets: Iterable[tuple[str, int]] = ()) -> list[Grant]:
        """Give back the pool slots of ``tickets`` ((key, ticket) pairs: their runs ended, or they no longer
        wait), and the expired ones; the oldest waiting tickets take the free slots. Returns their grants:
        publish those not pushed. One round trip, and one more if any ticket took a slot."""
        members = [pool_member(key, ticket) for key, ticket in tickets]
        call = pool_release_call(pool, grant_ms=self.dispatch_timeout_ms, members=members)
        return self.pool_granted(pool, self._pipelined([call])[0])

    def pool_renew(self, pool: str, leases: Iterable[Lease]) -> dict[Lease, bool]:
        """Hold the pool slots of running ``leases`` another lease; False for one whose slot went back."""
        held = list(leases)
        if not held:
            return {}
        members = [pool_member(h.key, h.ticket) for h in held]
        call = pool_renew_call(pool, hold_ms=self.running_hold_ms, members=members)
        return {lease: bool(ok) for lease, ok in zip(held, self._pipelined([call])[0], strict=True)}

    def pool_granted(self, pool: str, members: Sequence[bytes | str]) -> list[Grant]:
        """The keys of ``members``, to whom ``pool`` just gave slots, publish them again; a member whose
        ticket no longer holds its key's slot gives its pool slot back, and the next takes it."""
        grants: list[Grant] = []
        while members:
            tickets = [member_ticket(text(m)) for m in members]
            batch = [pool_granted_call(k, ticket=t, dispatch_timeout_ms=self.dispatch_timeout_ms) for k, t in tickets]
            gone: list[tuple[str, int]] = []
            for (key, ticket), (code, dispatch, message, pushed) in zip(tickets, self._pipelined(batch), strict=True):
                if code == Code.OK:
                    grants.append(Grant(key, ticket, int(dispatch), message, pushed=self.pushes.pushed(pushed)))
                elif code == Code.NOT_GRANTED:
                    gone.append((key, ticket))
            if not gone:
                break
            members = self._pipelined(
                [pool_release_call(pool, grant_ms=self.dispatch_timeout_ms, members=[pool_member(*g) for g in gone])]
            )[0]
        return grants

    def pool_names(self) -> list[str]:
        """Every pool tasks have used, by name."""
        return sorted(text(p) for p in self.client.smembers(POOLS))

    def inspect_pool(self, pool: str, *, waiting_shown: int = 20) -> PoolSnapshot:
        """What ``pool`` holds now: its limit and rate, who runs and who waits (two round trips)."""
        names = PoolNames(pool)
        now_ms = self._server_time_ms()
        running, waiting, first, meta = self._run(
            [
                ("ZRANGE", names.running, 0, -1, "WITHSCORES"),
                ("ZCARD", names.ready),
                ("ZRANGE", names.ready, 0, waiting_shown - 1),
                ("HGETALL", names.meta),
            ]
        )
        fields = texts(meta)

        def number(name: str) -> int | None:  # anyone may have written it
            value = fields.get(name, "")
            return int(value) if value.isascii() and value.isdigit() else None

        last = number("last_start")
        return PoolSnapshot(
            name=pool,
            task_limit=number("limit"),
            task_interval_ms=number("interval"),
            limit_override=number("limit_override"),
            interval_override_ms=number("interval_override"),
            running=[
                (*member_ticket(text(m)), ms_to_seconds(int(float(score)) - now_ms)) for m, score in scored(running)
            ],
            waiting=int(waiting),
            waiting_first=[member_ticket(text(m)) for m in first],
            last_start_ago=ms_to_seconds(now_ms - last) if last else None,
        )

    def set_pool_overrides(
        self, pool: str, *, limit: int | None | Unchanged = UNCHANGED, interval_ms: int | None | Unchanged = UNCHANGED
    ) -> list[Grant]:
        """Give ``pool`` an operator's ``limit`` and rate (``interval_ms``) over its tasks' own, or None to go
        back to them; ``UNCHANGED`` leaves one as it is. A raised limit gives free slots to waiting tickets at
        once (their grants are returned, to publish); a lowered one stops no run. Setting the same again
        changes nothing."""
        call = pool_override_call(
            pool,
            limit=override_value(limit),
            interval_ms=override_value(interval_ms),
            grant_ms=self.dispatch_timeout_ms,
        )
        members = self._pipelined([call], also=[("SADD", POOLS, pool)])[0]
        logger.debug("overrides of pool=%r: limit=%s interval_ms=%s", pool, limit, interval_ms)
        return self.pool_granted(pool, members)

    def reap_pools(self) -> list[Recovery]:
        """Return every pool's expired slots; the oldest waiting tickets take them (the reaper's pass, for a
        pool no call came to). Their grants, as the reaper's recoveries. One round trip a pool, and one more
        for each that gave a slot."""
        recoveries: list[Recovery] = []
        for pool in self.pool_names():
            recoveries += [granted_recovery(g) for g in self.pool_release(pool)]
        return recoveries

    def ask_pools_again(self, waiting: Sequence[Recovery]) -> list[Recovery]:
        """The reaper's ``pool`` recoveries (tickets that still waited for their pool at their deadline): each
        pool is asked again, as if the answer it gave was lost; a ticket given a slot is published again (a
        ``grant``), the others wait on (their deadline was moved)."""
        recoveries: list[Recovery] = []
        for r in waiting:
            pool = text(r.message or b"")
            if not pool:
                recoveries.append(r)
                continue
            acquired = self.pool_acquire(Pool(pool), r.key, r.ticket, starting=False)
            granted = acquired.granted
            if acquired.code is Code.OK:
                granted += self.pool_granted(pool, [pool_member(r.key, r.ticket)])
            recoveries += [granted_recovery(g) for g in granted]
            if not any((g.key, g.ticket) == (r.key, r.ticket) for g in granted):
                recoveries.append(r)  # it waits on (a slot freed meanwhile may have gone to it through another)
        return recoveries

    # ---- An operator's hold on keys: pause and resume, overrides, run now, the paused and blocked keys, refused
    # joins. Each list is one SET of its own (keys.PAUSED_KEYS, ...), in no key's slot, so no script of a key
    # can write it on a Redis Cluster: a list is kept by a command of its own, in the order that errs on the
    # safe side (each method says which).

    def pause(self, key: str, *, by: str = "") -> bool:
        """Grant nothing more on ``key``: running tasks finish, submissions queue in order. ``by`` (who
        paused it) and the time are kept for the operator who finds the key paused; False if it was
        paused already (its first pause is kept)."""
        # Listed first, in a call of its own, so that every paused key is listed (a listed key may
        # have failed to pause).
        self.client.sadd(PAUSED_KEYS, key)
        return pausing.paused(self._call(pausing.call(key, self, pause=True, by=by)))

    def resume(self, key: str) -> list[Grant] | None:
        """Let ``key`` grant again; returns the tickets granted at once, to be published, or None if the key
        was not paused (two racing resumes: one resumes it, the other is told so)."""
        reply = self._call_and_index(pausing.call(key, self, pause=False), key)
        # Unlisted after, in a call of its own, so that a key is never unlisted while it is still paused.
        self.client.srem(PAUSED_KEYS, key)
        return pausing.parse(key, reply, self.pushes.pushed)

    def set_overrides(self, key: str, *, limit: int | None | Unchanged = UNCHANGED,
                      interval_ms: int | None | Unchanged = UNCHANGED) -> Overridden:  # fmt: skip
        """Give ``key`` an operator's ``limit`` and rate (``interval_ms``, the least ms between two starts)
        over its tasks' own, or None to go back to them; ``UNCHANGED`` leaves one as it is. They apply
        from the next grant and start on; a raised limit grants waiting tickets at once, returned to be
        published; a lowered one takes back grants never started, newest first, down to it (they wait
        again; see ``override.lua``). Setting the same again changes nothing."""
        call = overriding.call(key, self, limit=limit, interval_ms=interval_ms)
        # Listed first, in a call of its own, so that every overridden key is listed.
        self.client.sadd(OVERRIDDEN_KEYS, key)
        reply = self._call_and_index(call, key)
        # Listed again after: a clear racing this set may have unlisted it between the first SADD and the script.
        self._list_as_overridden([key])
        withdrawn, granted = overriding.parse(key, reply, self.pushes.pushed)
        messages = self.client.hmget(KeyNames(key).messages, withdrawn) if withdrawn else []
        return Overridden(granted, [(t, stored_task_id(m)) for t, m in zip(withdrawn, messages, strict=True)])

    def _overridden_of(self, keys: list[str]) -> set[str]:
        """Which of ``keys`` have an operator's limit or rate (one pipelined read of their meta)."""
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.hmget(KeyNames(key).meta, "limit_override", "interval_override")
        return {key for key, values in zip(keys, pipe.execute(), strict=True) if any(v is not None for v in values)}

    def _list_as_overridden(self, keys: list[str]) -> set[str]:
        """List those of ``keys`` with an override, unlist the others; which have one. An unlisted key whose
        override a racing set wrote meanwhile is listed again: a key stays listed if any set's script ran
        last, and is unlisted only if a clear's did."""
        overridden = self._overridden_of(keys) if keys else set()
        if overridden:
            self.client.sadd(OVERRIDDEN_KEYS, *overridden)
        if stale := [key for key in keys if key not in overridden]:
            self.client.srem(OVERRIDDEN_KEYS, *stale)
            if back := self._overridden_of(stale):
                self.client.sadd(OVERRIDDEN_KEYS, *back)
                overridden |= back
        return overridden

    def overridden_keys(self, *, limit: int | None = None) -> list[str]:
        """The keys given a limit or rate of their own (:meth:`set_overrides`); at most ``limit`` of them.

        Checked against each key's meta, so that the list and the overrides agree (:meth:`_list_as_overridden`).
        """
        listed = self._listed(OVERRIDDEN_KEYS, limit)
        overridden = self._list_as_overridden(listed)
        return [key for key in listed if key in overridden]

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
            return sorted(text(member) for member in self.client.smembers(name))
        found: list[str] = []
        for member in self.client.sscan_iter(name, count=min(limit, 1000)):
            found.append(text(member))
            if len(found) == limit:
                break
        return sorted(found)

    def run_now(self, key: str, ticket: int, dispatch: int) -> Grant | None:
        """Start the granted ``ticket`` now, which waits for its key's rate or its message's eta: the grant to
        publish again, with its next dispatch (without an eta: that dispatch starts whatever the rate). None
        if it is not granted with ``dispatch`` (it started, ended or moved on)."""
        return running_now.parse(key, ticket, self._call_and_index(running_now.call(key, ticket, dispatch, self), key))

    def refuse_join(self, key: str, task_id: str, *, due_in_seconds: float = 0.0) -> bool:
        """Make sure the delayed task ``task_id`` never joins ``key``'s queue.

        False if it already joined (it has a ticket: cancel that instead).
        """
        reply = self._call(refusing_join.call(key, task_id, self, due_in_seconds=due_in_seconds))
        return refusing_join.parse(key, task_id, reply)

    # ---- Reads only (see inspection.py): snapshots of keys, a ticket's place in its queue, whether a lease
    # still holds.

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
            snapshots.append(key_snapshot(key, replies[6 * i : 6 * i + 6], now_ms))
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

    # ---- Records kept until the database has them (see unwritten.py): claim the keys holding them, read them,
    # forget those written.

    def claim_unwritten(self, *, claim_seconds: float, batch: int = 500, young: bool = True) -> list[tuple[str, int]]:
        """Claim up to ``batch`` keys holding submission records not yet written, for ``claim_seconds``;
        on a cluster, up to ``batch / shards`` (rounded up) of each shard of the unwritten index.
        ``young=False``: only keys whose first record is older than the record delay (a writer's
        pass in the background: a run that ends within it writes its row itself, once).

        Returns (key, claim) pairs; other callers pass a claimed key by until
        :meth:`forget_unwritten` releases it or the claim lapses.
        """
        shards = self.unwritten_index.names
        share = -(-batch // len(shards))  # a share of each shard's
        # A second past the delay: the index is scored on the submitting host's clock.
        ahead_ms = self.record_delay_ms + 1000 if young and self.record_delay_ms else 0
        claim_ms = seconds_to_ms(claim_seconds)
        batch_calls = [
            claim_unwritten_call(shard, claim_ms=claim_ms, most_keys=share, ahead_ms=ahead_ms) for shard in shards
        ]
        replies = self._pipelined(batch_calls)
        return [(text(flat[i]), int(flat[i + 1])) for flat in replies for i in range(0, len(flat), 2)]

    def unwritten(
        self, keys: Sequence[str], *, per_key: int = UNWRITTEN_PER_KEY, young: bool = True
    ) -> UnwrittenRecords:
        """The submission records kept for ``keys``, with their tickets' messages, in one round trip: about
        ``per_key`` of each key (a bounded step of Redis' work); ``more`` names the keys that keep others.
        ``young=False``: only records older than the record delay; ``young`` then names the keys that keep
        younger ones, with when they are due."""
        min_age_ms = 0 if young else self.record_delay_ms
        batch = [
            unwritten_call(key, count=per_key, keep_ms=self.idle_horizon_ms, min_age_ms=min_age_ms) for key in keys
        ]
        found, more, later = [], set(), {}
        for key, (left, oldest_young, *flat) in zip(keys, self._pipelined(batch), strict=True):
            if left:
                more.add(key)
            if int(oldest_young):
                later[key] = int(oldest_young) + self.record_delay_ms
            for field, kept, message in zip(flat[0::3], flat[1::3], flat[2::3], strict=True):
                found.append(Unwritten.read(key, field, kept, message or None))
        return UnwrittenRecords(found, frozenset(more), later)

    def kept_since(self, tickets: Sequence[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """When the gate took each of ``tickets`` ((key, ticket) pairs; server ms), of those whose submission's
        record it still keeps (until their rows are written). One round trip; reads only."""
        if not tickets:
            return {}
        pipe = self.client.pipeline(transaction=False)
        for key, ticket in tickets:
            pipe.hget(KeyNames(key).unwritten, str(ticket))
        found = {}
        for pair, kept in zip(tickets, pipe.execute(), strict=True):
            parts = kept.split(b"|", 2) if kept else []  # as submit.lua keeps it; anything else is passed by
            if len(parts) == 3 and parts[1].isdigit():
                found[pair] = int(parts[1])
        return found

    def replacement(self, key: str, task_id: str, *, ticket: int | None = None, max_hops: int) -> tuple[str, int]:
        """The task that replaced ``task_id`` of ``key`` while it waited (coalescing), the one that replaced that
        one, and so on, as far as the superseded records kept here until their rows are written tell, at most
        ``max_hops`` on: (the last one's id, how many replacements led to it); (``task_id``, 0) if none is kept.
        ``ticket``: the task's, if known (else found among the key's recent submissions). Reads only."""
        found, hops = self._call(replacement_call(key, task_id=task_id, ticket=ticket, max_hops=max_hops))
        return text(found), int(hops)

    def unclaim_unwritten(self, claims: Iterable[tuple[str, int]]) -> None:
        """Give back ``claims`` (from :meth:`claim_unwritten`) whose records were not written: due again at once."""
        if batch := reindex_calls(self.unwritten_index, moves=((key, claim, 0) for key, claim in claims)):
            self._pipelined(batch)

    def forget_unwritten(
        self,
        written: Iterable[Unwritten],
        claims: Iterable[tuple[str, int]] = (),
        later: Iterable[tuple[str, int, int]] = (),
    ) -> None:
        """Delete records whose rows are written, release ``claims`` (from :meth:`claim_unwritten`) of keys
        no submission was kept for since, and move those of ``later`` ((key, claim, ms when due)) to when
        their younger records are due; one round trip."""
        # Deleted first (on one server; a cluster's masters each take theirs): a claim released before
        # its records were deleted would leave them unindexed, until the key's next submission.
        deleted: list[Command] = [("HDEL", KeyNames(w.key).unwritten, w.field or w.ticket) for w in written]
        moves = [*((key, claim, -1) for key, claim in claims), *later]  # -1: removed
        released = reindex_calls(self.unwritten_index, moves=moves)
        if released:
            self._pipelined(released, before=deleted)
        elif deleted:
            self._run(deleted)

    def kept_outcome(self, key: str, field: str) -> bytes | None:
        """The record of a run's end kept with ``key`` under ``field`` until its worker writes it, if any."""
        (kept,) = self._run([("HGET", KeyNames(key).outcomes, field)])
        return kept.partition(b"|")[2] if kept is not None else None  # "<finished ms>|<record>"

    def forget_outcomes(self, written: Iterable[tuple[str, str]], *, records: Iterable[tuple[str, int]] = ()) -> None:
        """Delete the outcomes of runs whose records are written: (key, task id) pairs, and the submission
        records of ``records`` ((key, ticket) pairs) whose rows a run wrote itself; one round trip.

        A record's key stays in the unwritten index: a writer's next pass finds it empty and drops it (a
        submission made meanwhile may have indexed it again)."""
        fields: dict[str, list[EncodableT]] = {}  # each hash's fields, deleted in one command
        for key, task_id in written:
            fields.setdefault(KeyNames(key).outcomes, []).append(task_id)
        for key, ticket in records:
            fields.setdefault(KeyNames(key).unwritten, []).append(ticket)
        if fields:
            self._run([("HDEL", name, *deleted) for name, deleted in fields.items()])

    # ---- Recovery (see reaping.py): the keys due, their holders recovered, stranded grants published again, a
    # lost key rebuilt.

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
            # The blocked keys' list is a SET of its own slot, which reap.lua cannot write (see the operator's
            # calls above).
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

    # ---- Which keys have work (see listing.py): the deadline index earliest first, searched with the
    # operator's lists; keys that hold nothing.

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
        earliest = sorted(((score, text(m)) for reply in replies[: len(shards)] for m, score in reply))
        return IndexedKeys([key for _, key in earliest[:limit]], sum(replies[len(shards) :]))

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
            for name, is_sorted in sent:
                scan = pipe.zscan if is_sorted else pipe.sscan
                scan(name, cursors[name, is_sorted], match=pattern, count=SCAN_STEP)
            for (name, is_sorted), (cursor, members) in zip(sent, pipe.execute(), strict=True):
                found.update(text(m[0] if is_sorted else m) for m in members)
                if int(cursor) == 0:
                    del cursors[name, is_sorted]
                else:
                    cursors[name, is_sorted] = int(cursor)
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

    # ---- The deployment's totals for the metrics, summed over every process (process/totals.py makes and
    # reads the field names). Both hashes share a slot, so one round trip writes them on a Redis Cluster too.

    def add_totals(self, amounts: Mapping[str, int | float], templates: Mapping[str, str] | None = None) -> None:
        """Add ``amounts`` (field -> int, or float for a sum) to the totals, and note each task's key template."""
        commands: list[Command] = [
            ("HINCRBY" if isinstance(amount, int) else "HINCRBYFLOAT", TOTALS, field, amount)
            for field, amount in amounts.items()
        ]
        if templates:
            commands.append(("HSET", TOTALS_TEMPLATES, *(v for pair in templates.items() for v in pair)))
        if commands:
            self._run(commands)

    def totals(self) -> tuple[dict[str, str], dict[str, str]]:
        """Every total (field -> its number as Redis keeps it) and every task's key template."""
        amounts, templates = self._run([("HGETALL", TOTALS), ("HGETALL", TOTALS_TEMPLATES)])
        return texts(amounts), texts(templates)


__all__ = ["Gate", "NotSent", "ReplicasBehind"]
