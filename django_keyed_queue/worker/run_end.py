"""A run's end: it ends at the gate (succeeded, failed, rejected, ignored), its record is buffered, and
what its end grants is dispatched. The gate call is made after the fact, so it waits out a Redis
restart (``outage``): giving up would leave the key held until its lease expires."""

from __future__ import annotations

import logging
import time
import traceback
from datetime import timedelta
from typing import TYPE_CHECKING, cast

import redis
from celery.exceptions import Reject
from django.utils import timezone

from ..exceptions import InvalidKey
from ..gate import Code, FinishResult, KeptStart, Outcome
from ..messaging.dispatch import publish_grants
from ..messaging.message import ENQUEUED_HEADER, HEADER, gate_message
from ..process.outage import outlast_restart
from ..process.state import current
from ..records.models import KeyedTask
from ..records.statuses import Status
from ..records.submissions import ended_with_record
from . import handoff
from .attempt_errors import ERRORS_HEADER, earlier_errors, with_earlier
from .run_base import RunBase, request_options

if TYPE_CHECKING:
    pass


logger = logging.getLogger(__name__)

#: How much of a failed run's traceback its record keeps (the end of it, where the error is).
TRACEBACK_CHARS = 4000


class RunEnd(RunBase):
    def succeed(self) -> bool:
        return self.finish(Status.SUCCEEDED)

    def fail(self, exc: BaseException) -> bool:
        return self.finish(Status.FAILED, error=failure_text(exc))

    def _stored_message(self) -> str:
        """This run's message as the gate stores it: what an operator's retry of a failed task submits
        again, kept on its record (the gate forgets it once the run ends)."""
        request = self.task.request
        options = request_options(request)
        options.pop("retries", None)  # a retry is a new task: its own retries count from 0
        headers = {
            k: v for k, v in (options.get("headers") or {}).items() if k not in (HEADER, ERRORS_HEADER, ENQUEUED_HEADER)
        }
        options["headers"] = headers or None
        message = gate_message(self.task.name, cast(str, request.id), request.args or (), request.kwargs or {}, options)
        return message.encode(self.task.serializer).decode()

    def reject(self, exc: Reject) -> None:
        """The task raised Celery's ``Reject``: its message is dropped, or requeued for the same message to run again.

        A requeued message keeps the ticket's slot and may start it again (its dispatch is
        unchanged). Celery requeues only a message not yet acknowledged (``acks_late``); an
        early-acknowledged one is gone, as with a plain task, and the key moves on.
        """
        task, lease = self.task, self.lease
        # celery-types' Reject lacks its attributes.
        reason, requeue = getattr(exc, "reason", None), bool(getattr(exc, "requeue", False))
        if isinstance(reason, InvalidKey):
            # Celery's retry could not be sent (``self.retry`` with arguments of another key): a mistake, not a choice.
            self.finish(Status.FAILED, error=failure_text(reason))
            return
        if not (requeue and task.acks_late):
            self.finish(Status.REJECTED, error=failure_text(exc))
            return
        self.let_go()
        gate = current().gate
        requeued, _ = outlast_restart(lambda: gate.requeue(lease.key, lease.ticket, lease.token))
        if requeued:
            self.give_back_pool_slot()  # the requeued message asks its pool again
            self._count_end("requeued")
            handoff.local().requeue_kept(task.app, cast(str, task.request.id), lease.key, lease.ticket)
            error = "requeued by Reject(requeue=True): its message runs again"
            current().recorder.buffer(self._transition(Status.RETRYING, error=error))

    def finish(self, status: str, error: str = "") -> bool:
        """End the run at the gate; False if this attempt no longer held its key (fenced)."""
        self.let_go()
        if self.retried:
            return True  # self.retry() handed the slot to the retry (also with throw=False)
        task, lease, request = self.task, self.lease, self.task.request
        process = current()
        gate = process.gate
        error = with_earlier(error, earlier_errors(request))
        # The gate keeps the run's outcome until its record is written: a kill of this process
        # after the finish loses nothing (the reaper writes it).
        end = self._transition(status, finished_at=timezone.now(), error=error)
        if status == Status.FAILED:
            try:
                end.message = self._stored_message()
            except Exception:  # what a retry needs is worth less than ending the run
                logger.warning("%s[%s]: its message is not kept for a retry", task.name, request.id, exc_info=True)
        buffered = process.recorder.peek(end.submission)
        end = buffered.merged_with(end) if buffered else end
        end.outcome_key = lease.key
        outcome = Outcome(end.outcome_field, end.to_json())
        # A grant kept here has a lease's time to start; if this process dies first, the reaper publishes it.
        # One of this task the finish starts itself (no start call): a kill before it runs is then a lost
        # run, recovered as one. Not for a paced or debounced key (its rate or eta decides when) nor a task
        # never recovered.
        keeping = handoff.local().may_keep(request)
        keep_seconds = gate.lease_ms / 1000 if keeping else 0.0
        start_kept = None
        # A pooled task only where the finish can ask its pool too (one server).
        if (
            keeping
            and not task.serial_interval_ms
            and not task.serial_debounce_ms
            and task.max_recoveries > 0
            and (task.serial_pool is None or not gate.pools_apart)
        ):
            start_kept = KeptStart(task.name, task.max_recoveries, task.blocks_on_failure)
        try:
            finished, retried = outlast_restart(
                lambda: gate.finish(
                    lease.key,
                    lease.ticket,
                    lease.token,
                    limit=task.serial_limit,
                    outcome=outcome,
                    block=status == Status.FAILED and task.blocks_on_failure,
                    keep_first_seconds=keep_seconds,
                    start_kept=start_kept,
                    pool=task.serial_pool,
                )  # fmt: skip
            )
        except redis.RedisError:
            logger.exception("finishing key=%r ticket=%s failed; its lease will expire", lease.key, lease.ticket)
            return True
        if finished.unwritten is not None:  # its row is not written yet: written once, as it ended
            end = ended_with_record(end, finished.unwritten)
        if not finished.ok and retried:
            # The first try may have gone through, its reply lost: then the ticket is done, or it
            # blocks its key.
            snapshot = gate.inspect(lease.key, waiting_shown=0)
            if snapshot.blocks(lease.ticket):
                finished = FinishResult(Code.BLOCKED)
            elif lease.ticket not in snapshot.holders:
                logger.warning("finish of key=%r ticket=%s was applied before Redis went away", lease.key, lease.ticket)
                self.give_back_pool_slot()
                process.recorder.buffer(end)
                self._count_end(status)
                # What it granted was never published: publish it now, not after the dispatch
                # timeout. If a copy did go out, the first to start runs and the other is dropped.
                # One it started for this process to keep is given back first, unstarted.
                kept = gate.kept_by(lease.key, lease.token)
                if kept and gate.requeue(lease.key, *kept, unstarted=True):  # the script checks it still runs
                    snapshot = gate.inspect(lease.key, waiting_shown=0)
                granted = [t for t, holder in snapshot.holders.items() if holder.state == "granted"]
                publish_grants(task.app, [r for t in granted for r in gate.release(lease.key, t)])
                return True
        if finished.code is Code.BLOCKED:
            logger.warning(
                "%s[%s] failed and blocks key=%r (on_failure='block'): nothing more of the key runs until "
                "an operator retries or cancels it", task.name, request.id, lease.key,
            )  # fmt: skip
            publish_grants(task.app, finished.granted)  # its pool slot went to them
            process.recorder.buffer(end)
            self._count_end(status)
            return True
        if not finished.ok:
            # The lease was lost and the reaper acted: the record follows the run it dispatched.
            logger.warning(
                "%s[%s] finished after losing its lease (fenced) key=%r ticket=%s",
                task.name, request.id, lease.key, lease.ticket,
            )  # fmt: skip
            process.totals.count("fenced", task)
            try:
                began = timezone.now() - timedelta(seconds=time.monotonic() - self._began)
                KeyedTask.objects.note_ran_on(
                    cast(str, request.id), lease.key, lease.ticket, self.attempts, began, timezone.now()
                )
            except Exception:  # a note is worth less than ending the run
                logger.warning(
                    "%s[%s]: its run after losing its key is not noted", task.name, request.id, exc_info=True
                )
            return False
        process.recorder.buffer(end)
        self._count_end(status)
        handoff.local().hand_over(task.app, request, finished.granted)
        return True


def failure_text(exc: BaseException) -> str:
    """The error of a failed run, as its record keeps it: the exception, then its traceback."""
    trace = "".join(traceback.format_exception(exc)).rstrip()
    if len(trace) > TRACEBACK_CHARS:
        trace = "…" + trace[-TRACEBACK_CHARS:]
    return f"{type(exc).__name__}: {exc}\n\n{trace}"
