"""A ticket's life: taken, granted, started, renewed, retried, finished or withdrawn.

These are the calls of producers and workers, on the hot path: each is one script call in one
round trip (``unblock``, an operator's, says why it is not). Each call's arguments are built and its
reply read by the transition's module beside its script (``start.py`` beside ``lua/start.lua``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import replace

from . import cancel as cancelling
from . import finish as finishing
from . import renew as renewing
from . import republish_soon as republishing
from . import requeue as requeueing
from . import retry as retrying
from . import start as starting
from . import stop as stopping
from . import submit
from . import unblock as unblocking
from . import wait_to_start as waiting_to_start
from .base import text
from .cancel import Cancel
from .finish import Finish
from .keys import BLOCKED_KEYS, POOLS, KeyNames, pool_member
from .pools import PoolAcquired, PoolCalls
from .results import (
    FinishResult,
    Lease,
    QueueFull,
    StartResult,
    Stopping,
    SubmitResult,
)
from .scripts import Code, seconds_to_ms
from .start import Start
from .submit import Submission
from .transport import Command

logger = logging.getLogger(__name__)

#: How many times a start asked apart of its pool asks again if its slot went back before its key's start.
POOL_TRIES = 3


class TicketCalls(PoolCalls):
    """Submit, start, renew, retry, requeue, finish, cancel, unblock and stop tickets."""

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
