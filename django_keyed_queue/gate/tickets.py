"""A ticket's life: taken, granted, started, renewed, retried, finished or withdrawn.

These are the calls of producers and workers, on the hot path: each is one script call in one
round trip (``unblock``, an operator's, says why it is not). Their arguments are built in
``calls.py``, one builder per script.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

from . import calls
from .base import grants, stored_text, text
from .keys import BLOCKED_KEYS, POOLS, KeyNames, pool_member
from .pools import Pool, PoolAcquired, PoolCalls
from .results import (
    FinishResult,
    KeptStart,
    Lease,
    Outcome,
    QueueFull,
    StartResult,
    Stopping,
    Submission,
    SubmitResult,
    Unwritten,
)
from .scripts import Code, ms_to_seconds, seconds_to_ms
from .transport import Command

logger = logging.getLogger(__name__)

#: A submission retried after its reply was lost finds its ticket for at least this long.
RECENT_SUBMISSION_SECONDS = 30.0


#: How many times a start asked apart of its pool asks again if its slot went back before its key's start.
POOL_TRIES = 3


class TicketCalls(PoolCalls):
    """Submit, start, renew, retry, requeue, finish, cancel, unblock and stop tickets."""

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
        wire: bytes = b"",
        coalesce: str = "",
        debounce_ms: int = 0,
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
        A non-empty ``wire`` (``messaging/wire.py``) is pushed onto the broker's queue by the call
        that grants the ticket (``SubmitResult.pushed``, ``Grant.pushed``).
        A non-empty ``coalesce`` (the task's name): a ticket that must wait replaces the one of that
        task waiting, whose record is kept as superseded (``SubmitResult.superseded``); with
        ``debounce_ms`` > 0 also its granted ticket not started yet (its message waits out its eta).
        """
        call = self._submit_call(
            key, message, limit=limit, lease_ms=self.lease_ms if start else 0, join_id=join_id, max_lost=max_lost,
            block=block, task_id=task_id, retried=retried, max_waiting=max_waiting, record=record, wire=wire,
            coalesce=coalesce, debounce_ms=debounce_ms,
        )  # fmt: skip
        recorded = [key] if record or coalesce else []  # a superseded ticket's record is kept too
        [reply] = self._pipelined([call], index=key, also=self._index_unwritten(recorded))
        if reply[0] == Code.DUPLICATE:
            logger.debug("submit key=%r join_id=%s duplicate", key, join_id)
            return None
        result = _submit_result(key, reply, self.pushes.pushed)
        if isinstance(result, QueueFull):
            raise result
        return result

    def submit_many(
        self, submissions: Sequence[Submission], *, retried: bool = False
    ) -> list[SubmitResult | QueueFull]:
        """Submit each of ``submissions`` as :meth:`submit` does, in order, in one round trip.

        A key at its ``max_waiting`` gets its ``QueueFull`` in the list, and no ticket.
        """
        batch = [
            self._submit_call(
                s.key,
                s.message,
                limit=s.limit,
                task_id=s.task_id,
                retried=retried,
                max_waiting=s.max_waiting,
                record=s.record,
                wire=s.wire,
                coalesce=s.coalesce,
                debounce_ms=s.debounce_ms,
            )  # fmt: skip
            for s in submissions
        ]
        if not batch:
            return []
        recorded = [s.key for s in submissions if s.record or s.coalesce]
        replies = self._pipelined(batch, index=[s.key for s in submissions], also=self._index_unwritten(recorded))
        return [_submit_result(s.key, reply, self.pushes.pushed) for s, reply in zip(submissions, replies, strict=True)]

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
        wire: bytes = b"",
        coalesce: str = "",
        debounce_ms: int = 0,
    ) -> calls.ScriptCall:
        """``submit.lua``'s call with this gate's durations filled in."""
        return calls.submit(
            key, message=message, limit=limit, dispatch_timeout_ms=self.dispatch_timeout_ms, lease_ms=lease_ms,
            join_id=join_id, idle_horizon_ms=self.idle_horizon_ms, max_lost=max_lost, retried=retried,
            task_id=task_id, max_waiting=max_waiting, generation_ms=seconds_to_ms(RECENT_SUBMISSION_SECONDS),
            record=record, block=block, wire=wire, coalesce=coalesce, debounce_ms=debounce_ms,
        )  # fmt: skip

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
        pool: Pool | None = None,
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

        With ``pool``, the ticket also needs a slot of that pool (``pools.py``), asked in the same call
        on one server, apart on a Redis Cluster: without one it waits for its pool (``Code.PARKED``), and
        the pool's rate may make it ``Code.TOO_EARLY`` as a key's does. ``StartResult.granted``: tickets a
        slot the pool freed meanwhile went to, to publish.
        """
        if pool is not None and self.pools_apart:
            return self._start_pooled_apart(key, ticket, dispatch, pool, max_lost, block, task_id, interval_ms)
        call = calls.start(
            key, ticket=ticket, dispatch=dispatch, lease_ms=self.lease_ms, max_lost=max_lost, task_id=task_id,
            block=block, interval_ms=interval_ms,
            **(self._pool_asked_here(pool, key, ticket) if pool is not None else {}),
        )  # fmt: skip
        # Indexed too: this process's lease may be shorter than the one the granting process assumed. A pool is
        # named among the pools once per gate, for the reaper's pass (its start and finish never name it).
        also = [("SADD", POOLS, pool.name)] if pool is not None and pool.name not in self.named_pools else []
        # A refusal of the key's (no slot, another dispatch ...) is the first four fields alone.
        code, token, attempts, deadline, *rest = self._pipelined([call], index=key, also=also)[0]
        if pool is not None:
            self.named_pools.add(pool.name)
        message, pooled = (rest[0], rest[1]) if rest else (None, [])
        granted = self.pool_grants(pooled)
        if code == Code.TOO_EARLY:
            return StartResult(
                Code(code), attempts=int(attempts), wait_seconds=ms_to_seconds(deadline), message=message,
                granted=granted,
            )  # fmt: skip
        result = StartResult(Code(code), int(token), int(attempts), int(deadline), granted=granted)
        logger.debug("start key=%r ticket=%s code=%s", key, ticket, result.code.name)
        return result

    def _pool_asked_here(self, pool: Pool, key: str, ticket: int) -> dict[str, Any]:
        """``calls.start``'s arguments that ask ``pool`` in the same call."""
        return {
            "pool": pool.name, "pool_member": pool_member(key, ticket), "pool_limit": pool.limit or 0,
            "pool_interval_ms": pool.interval_ms or 0, "pool_hold_ms": self.running_hold_ms,
            "dispatch_timeout_ms": self.dispatch_timeout_ms,
        }  # fmt: skip

    def _start_pooled_apart(
        self,
        key: str,
        ticket: int,
        dispatch: int,
        pool: Pool,
        max_lost: int,
        block: bool,
        task_id: str,
        interval_ms: int,
    ) -> StartResult:
        """:meth:`start` of a pooled ticket on a Redis Cluster: the pool first, in a call of its own, then the key."""
        acquired = self.pool_acquire(pool, key, ticket)
        started = self.start_after_pool(
            acquired, key, ticket, dispatch, pool, max_lost=max_lost, block=block, task_id=task_id,
            interval_ms=interval_ms,
        )  # fmt: skip
        return replace(started, granted=[*acquired.granted, *started.granted])

    def start_after_pool(
        self,
        acquired: PoolAcquired,
        key: str,
        ticket: int,
        dispatch: int,
        pool: Pool,
        *,
        max_lost: int = 0,
        block: bool = False,
        task_id: str = "",
        interval_ms: int = 0,
        tries: int = POOL_TRIES,
    ) -> StartResult:
        """The rest of a start whose pool was asked apart (:meth:`_start_pooled_apart`), once the pool said
        ``acquired``: it waits for its pool, waits for the pool's rate, or its key is asked. Its ``granted`` are
        the tickets given slots after that answer (``acquired.granted`` are the caller's to publish).

        Other calls may come between the pool's answer and the key's. A slot given to a message its key refuses
        goes where the pool meant it: to the ticket (published again) while it holds its key, else on. The slot
        is checked once the key has started the ticket: a start whose slot went back meanwhile (a copy of its
        message ran and was requeued; its slot expired) is undone and the pool asked again, ``tries`` times."""
        if acquired.code is Code.PARKED:
            self.pool_wait(key, ticket, dispatch, pool=pool.name)
            return StartResult(Code.PARKED)
        if acquired.code is Code.TOO_EARLY:
            stored = self.client.hget(KeyNames(key).messages, ticket)
            message = stored.encode() if isinstance(stored, str) else stored
            # Its dispatch deadline moves past then, so that the reaper publishes no copy sooner.
            delay_ms = seconds_to_ms(acquired.wait_seconds) + self.lease_ms
            move = calls.republish_soon(key, ticket=ticket, dispatch=dispatch, delay_ms=delay_ms, later=True)
            self._pipelined([move], index=key, index_within_ms=delay_ms)
            return StartResult(Code.TOO_EARLY, wait_seconds=acquired.wait_seconds, message=message)
        started = self.start(key, ticket, dispatch, max_lost=max_lost, block=block, task_id=task_id,
                             interval_ms=interval_ms)  # fmt: skip
        if started.ok:
            lease = Lease(key, ticket, started.token)
            if self.pool_renew(pool.name, [lease])[lease]:
                return started
            self.requeue(key, ticket, started.token, unstarted=True)
            if tries <= 1:  # its message is dropped: the reaper publishes the ticket again at its dispatch timeout
                logger.warning("key=%r ticket=%s lost its pool slot at each of %d starts", key, ticket, POOL_TRIES)
                return StartResult(Code.NOT_GRANTED)
            again = self.pool_acquire(pool, key, ticket)
            retried = self.start_after_pool(
                again, key, ticket, dispatch, pool, max_lost=max_lost, block=block, task_id=task_id,
                interval_ms=interval_ms, tries=tries - 1,
            )  # fmt: skip
            return replace(retried, granted=[*again.granted, *retried.granted])
        if started.code is Code.NOT_GRANTED or (acquired.given and started.code is not Code.ALREADY_STARTED):
            return replace(started, granted=self.pool_granted(pool.name, [pool_member(key, ticket)]))
        return started

    def wait_to_start(self, key: str, ticket: int, dispatch: int, *, interval_ms: int) -> tuple[float, bytes | None]:
        """Seconds before the message of ``dispatch`` may start ``ticket`` under a rate of one start per
        ``interval_ms`` on ``key``, and the ticket's stored message if it must wait; (0.0, None) when it
        may start now, or may not start at all (:meth:`start` says why). A check, not a claim."""
        wait, *message = self._call(
            calls.wait_to_start(key, ticket=ticket, dispatch=dispatch, interval_ms=interval_ms, lease_ms=self.lease_ms)
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
        keep_first_seconds: float = 0.0,
        start_kept: KeptStart | None = None,
        pool: str | None = None,
    ) -> FinishResult:
        """End a running ticket and grant the next ones; their messages are returned (each pushed to the
        broker already where the producer left a template: ``Grant.pushed``).

        ``keep_first_seconds`` > 0: the caller keeps the first grant to run it itself (a worker's local
        handoff): it is not pushed, and the reaper publishes it if it has not started within that long.
        With ``start_kept`` too, a kept grant of that task is started for the caller in the same call
        (``Grant.token``): its lease runs from now, and the reaper recovers it as any lost run.

        ``outcome`` is kept with the key until
        :meth:`forget_outcomes`; the reaper hands back outcomes left too long.
        ``block``: the run failed for good and its task blocks its key on failure:
        the ticket keeps its slot and the key is blocked (``Code.BLOCKED``) until
        :meth:`unblock`; it is listed among :meth:`blocked_keys` in the same round trip.
        ``pool``: the run's pool slot goes back (also when it blocks its key), in the same call on one server,
        in one more on a Redis Cluster; the tickets the slot goes to are among the grants, after the key's.
        On one server a kept grant started here asks its pool here too (after the pool's line was served); on
        a Redis Cluster a pooled finish starts no kept grant.
        """
        here = pool is not None and not self.pools_apart
        if pool is not None and not here:
            start_kept = None  # its pool is apart: the kept grant's own start asks it
        call = calls.finish(
            key, ticket=ticket, token=token, limit=limit, dispatch_timeout_ms=self.dispatch_timeout_ms,
            idle_horizon_ms=self.idle_horizon_ms, task_id=outcome.task_id if outcome else "",
            record=outcome.record if outcome else b"", block=block, kept_ms=seconds_to_ms(keep_first_seconds),
            start_kept=(
                f"{self.lease_ms}|{start_kept.max_lost}|{int(start_kept.block)}|{start_kept.task_name}"
                if start_kept and keep_first_seconds > 0 else ""
            ),
            pool=pool if here and pool else "", pool_member=pool_member(key, ticket) if here else "",
            pool_hold_ms=self.running_hold_ms if here else 0,
        )  # fmt: skip
        # A kept grant's deadline may be sooner than the index's hint: index it by then.
        within = seconds_to_ms(keep_first_seconds) if keep_first_seconds > 0 else None
        [reply] = self._pipelined(
            [call], index=key, index_within_ms=within, also=[("SADD", BLOCKED_KEYS, key)] if block else ()
        )
        granted = grants(key, reply[6:], self.pushes.pushed)
        if granted and int(reply[1]):
            granted[0] = replace(granted[0], token=int(reply[1]), attempts=int(reply[2]))
        kept, message = (reply[3], reply[4]) if len(reply) > 3 else (b"", b"")
        unwritten = Unwritten.read(key, str(ticket).encode(), kept, message or None) if kept else None
        if pool is not None and reply[0] in (Code.OK, Code.BLOCKED):
            granted += self.pool_grants(reply[5]) if here else self.pool_release(pool, [(key, ticket)])
        result = FinishResult(Code(reply[0]), granted, unwritten)
        tickets = [g.ticket for g in granted]
        logger.debug("finish key=%r ticket=%s code=%s granted=%s", key, ticket, result.code.name, tickets)
        return result

    def kept_by(self, key: str, token: int) -> tuple[int, int] | None:
        """The (ticket, token) that the finish of the run holding ``token`` started for its caller, if it
        was the key's last such start: for a caller whose reply to that finish was lost."""
        raw = self.client.hget(KeyNames(key).meta, "kept")
        parts = text(raw).split("|") if raw else []
        if len(parts) != 3 or not all(p.isdigit() for p in parts) or int(parts[0]) != token:
            return None
        return int(parts[1]), int(parts[2])

    def retry(self, key: str, ticket: int, token: int, message: bytes, *, countdown_seconds: float) -> int | None:
        """Keep ``ticket``'s slot through a retry; returns the retry's dispatch, None if fenced."""
        code, dispatch = self._call(
            calls.retry(
                key,
                ticket=ticket,
                token=token,
                countdown_ms=seconds_to_ms(countdown_seconds),
                dispatch_timeout_ms=self.dispatch_timeout_ms,
                message=message,
            )  # fmt: skip
        )
        logger.debug("retry key=%r ticket=%s code=%s dispatch=%s", key, ticket, Code(code).name, dispatch)
        return int(dispatch) if code == Code.OK else None

    def requeue(self, key: str, ticket: int, token: int, *, unstarted: bool = False) -> bool:
        """A running ticket's message goes back to the broker (``Reject(requeue=True)``): the same
        message may start the ticket again, which keeps its slot meanwhile. False if fenced.

        If that delivery never comes, the dispatch timeout publishes the stored message again.
        ``unstarted``: the attempt never ran (a kept grant ``finish`` started that goes by broker after
        all): it is not counted.
        """
        [code] = self._call(
            calls.requeue(
                key, ticket=ticket, token=token, dispatch_timeout_ms=self.dispatch_timeout_ms, unstarted=unstarted
            )
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
        call = calls.cancel(
            key, ticket=ticket, limit=limit, dispatch_timeout_ms=self.dispatch_timeout_ms,
            idle_horizon_ms=self.idle_horizon_ms, forget=forget, failed=failed or forget, dispatch=dispatch,
            task_id=task_id or "", failed_for_good=failed_for_good,
        )  # fmt: skip
        # A ticket blocked now is listed among blocked_keys() in the same round trip, as finish's.
        listed: list[Command] = [("SADD", BLOCKED_KEYS, key)] if failed_for_good else []
        [reply] = self._pipelined([call], index=key, also=listed)
        result = FinishResult(Code(reply[0]), grants(key, reply[1:], self.pushes.pushed))
        logger.debug("cancel key=%r ticket=%s code=%s", key, ticket, result.code.name)
        return result

    def unblock(self, key: str, ticket: int, *, retry: bool) -> FinishResult:
        """Act on the ticket that blocks ``key``: run it again at the head of the queue (``retry``: the
        ticket itself is returned, with its next dispatch), or withdraw it (the tickets granted in its
        place are returned). ``Code.NOT_GRANTED`` if it does not block the key.

        Two round trips: the script, then, if it acted, the key is taken off :meth:`blocked_keys`.
        That list is one SET of its own (its own slot on a cluster), which no script of a key may
        touch, and it is taken off only if the script acted. Should the second call fail, the list
        keeps a key no longer blocked, which :meth:`blocked_keys` drops when it next reads it.
        """
        call = calls.unblock(
            key, ticket=ticket, retry=retry, dispatch_timeout_ms=self.dispatch_timeout_ms,
            idle_horizon_ms=self.idle_horizon_ms,
        )  # fmt: skip
        reply = self._call_and_index(call, key)
        result = FinishResult(Code(reply[0]), grants(key, reply[1:], self.pushes.pushed))
        if result.code is Code.OK:
            self.client.srem(BLOCKED_KEYS, key)
        logger.debug("unblock key=%r ticket=%s retry=%s code=%s", key, ticket, retry, result.code.name)
        return result

    def stop(self, key: str, ticket: int, dispatch: int, *, by: str, how: str) -> Stopping | None:
        """Stop the attempt of ``ticket`` started by the message of ``dispatch``: it is not recovered, and
        keeps its slot until it has ended (``release`` of that dispatch, once its process is gone, or its
        lease's end). ``by``: the operator ('' for Celery killing it: noted only if nobody stopped it);
        ``how``: what is done to its process. Who stopped it first; None if that attempt does not run."""
        call = calls.stop(key, ticket=ticket, dispatch=dispatch, by=by, how=how.replace("|", "/"))
        code, stopped_by, since_ms, stopped_how = self._call(call)
        logger.debug("stop key=%r ticket=%s code=%s", key, ticket, Code(code).name)
        if Code(code) is not Code.OK:
            return None
        return Stopping(stored_text(stopped_by), int(since_ms), stored_text(stopped_how))

    def renew(self, leases: Iterable[Lease]) -> dict[Lease, bool]:
        """Extend many leases in one round trip (one script call per key, pipelined)."""
        by_key: dict[str, list[Lease]] = {}
        for lease in leases:
            by_key.setdefault(lease.key, []).append(lease)
        if not by_key:
            return {}
        batch = [calls.renew(key, lease_ms=self.lease_ms, leases=held) for key, held in by_key.items()]
        outcome: dict[Lease, bool] = {}
        for held, reply in zip(by_key.values(), self._pipelined(batch), strict=True):
            outcome.update({lease: bool(ok) for lease, ok in zip(held, reply, strict=True)})
        return outcome


def _submit_result(key: str, reply: list[Any], read_pushed: Callable[[Any], bool]) -> SubmitResult | QueueFull:
    code, ticket, token, _, pushed, *replaced = reply
    if code == Code.QUEUE_FULL:
        return QueueFull(key, int(ticket))
    superseded = (int(replaced[0]), text(replaced[1])) if replaced and int(replaced[0]) else None
    result = SubmitResult(
        ticket=int(ticket), granted=code == Code.OK, token=int(token), pushed=read_pushed(pushed), superseded=superseded
    )
    logger.debug("submit key=%r ticket=%s granted=%s", key, result.ticket, result.granted)
    return result
