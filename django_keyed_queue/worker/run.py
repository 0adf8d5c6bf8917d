"""A run: one attempt of a keyed task in a worker process, from taking its slot to ending it.

``Run.begin`` starts the ticket its message names (or, for a delayed task now due, takes one: the
gate's side of a start is ``run_start``'s), ``succeed``, ``fail``, ``reject`` and ``finish`` end it at
the gate and dispatch what that grants (the next task run here is ``handoff``'s), and
``retry_in_place`` keeps its slot through ``self.retry()``. The gate call of an end is made after the
fact, so it waits out a Redis restart (``outage``): giving up would leave the key held until its lease
expires. An attempt Celery kills ends in ``killed``.
"""

from __future__ import annotations

import logging
import sys
import time
import traceback
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Self, cast

import redis
from celery.exceptions import Reject
from django.utils import timezone

from ..conf import settings
from ..exceptions import InvalidArguments, InvalidKey
from ..gate import Code, Finish, FinishResult, Lease, Outcome
from ..messaging.building import SendNow, send_to_gate
from ..messaging.dispatch import give_back_pool_slot, publish_grants
from ..messaging.message import (
    ENQUEUED_HEADER,
    HEADER,
    JOIN_HEADER,
    TaskMessage,
    gate_message,
    send_options,
    ticket_header,
)
from ..process.outage import outlast_restart
from ..process.state import current, worker_gate
from ..records.columns import shown
from ..records.models import KeyedTask
from ..records.statuses import Status
from ..records.submissions import ended_with_record
from ..records.transitions import Transition
from . import handoff
from .attempt_errors import ERRORS_HEADER, carried, earlier_errors, with_earlier
from .run_start import join_or_start, request_options, submitted_at, waited_for_key

if TYPE_CHECKING:
    from celery.result import AsyncResult

    from ..messaging.task_type import KeyedTaskProtocol


logger = logging.getLogger(__name__)

#: How long ``Run.superseded`` answers from what it last read: a task may ask in a tight loop.
SUPERSEDED_READ_SECONDS = 0.1

#: How much of a failed run's traceback its record keeps (the end of it, where the error is).
TRACEBACK_CHARS = 4000


class Run:
    """One attempt of a keyed task: begun with ``Run.begin``, ended with ``succeed``, ``fail``,
    ``reject`` or ``finish``, or handed to its retry with ``retry_in_place``."""

    def __init__(self, task: KeyedTaskProtocol, lease: Lease, attempts: int) -> None:
        self.task = task
        self.lease = lease
        self.attempts = attempts
        #: ``self.retry()`` handed the slot to the retry: this attempt's end finishes nothing.
        self.retried = False
        self._superseded, self._superseded_read_at = False, -SUPERSEDED_READ_SECONDS
        self._began = time.monotonic()

    @classmethod
    def begin(cls, task: KeyedTaskProtocol, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Self:
        """Take the slot the message's ticket was granted; raises Ignore when this message may not run."""
        request = task.request
        header = getattr(request, HEADER, None)
        lease, attempts = join_or_start(task, header, args, kwargs)
        now = timezone.now()
        process = current()
        # A delayed task's run: its row, written without a ticket, may not have the join's yet.
        joins = header is None or hasattr(request, JOIN_HEADER)
        submitted = submitted_at(request)
        # Submitted within the record delay: no writer's pass wrote its row yet, so this run makes it.
        young = submitted is not None and time.time() - submitted < settings.RECORD_DELAY_SECONDS
        # A run's request always has its task's id: ``cast(str, request.id)`` (celery-types' Context allows None).
        process.recorder.buffer(
            Transition(
                cast(str, request.id),
                lease.key,
                lease.ticket,
                Status.RUNNING,
                attempts,
                {
                    "started_at": now,
                    "heartbeat_at": now,
                    "worker": request.hostname or "",
                    **({"first_started_at": now} if attempts == 1 else {}),
                },  # fmt: skip
                joins=joins,
                insert_first=young and attempts == 1 and not joins,
                create={
                    "task_name": task.name,
                    "enqueued_at": datetime.fromtimestamp(submitted, UTC) if submitted is not None else now,
                    "args": args,
                    "kwargs": kwargs,
                    # Celery's request has them only when the message had them.
                    "argsrepr": getattr(request, "argsrepr", None),
                    "kwargsrepr": getattr(request, "kwargsrepr", None),
                },  # fmt: skip
            )
        )
        tag_error_reports(lease.key, attempts)
        process.leases.hold(lease, cast(str, request.id), attempts, task.serial_pool)
        process.totals.count("started", task)
        waited = waited_for_key(request) if attempts == 1 else None
        if waited is not None:
            process.totals.observe("wait_seconds", task, waited)
        return cls(task, lease, attempts)

    def check_key(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Raise ``InvalidKey`` if the arguments this run received make another key than its ticket's: the
        task's key function read something besides them, or an argument changed form in the message."""
        drift = key_drift(self.task, self.lease.key, args, kwargs)
        if drift is not None:
            raise drift

    def _transition(self, status: str, **fields: Any) -> Transition:
        """This attempt's record moving to ``status``."""
        request_id = self.task.request.id
        return Transition(cast(str, request_id), self.lease.key, self.lease.ticket, status, self.attempts, fields)

    def holds_key(self) -> bool:
        """True while the lease was not lost (one round trip)."""
        process = current()
        if process.leases.is_lost(self.lease):
            return False
        return outlast_restart(lambda: worker_gate().holds(self.lease))[0]

    def superseded(self) -> bool:
        """Whether a newer submission of this coalescing task waits behind this run: read from the gate
        at most every ``SUPERSEDED_READ_SECONDS``, and True for good once it was. False while Redis is
        out of reach (a hint: the run goes on)."""
        now = time.monotonic()
        if self._superseded or now - self._superseded_read_at < SUPERSEDED_READ_SECONDS:
            return self._superseded
        self._superseded_read_at = now
        try:
            self._superseded = worker_gate().newer_waiting(self.lease.key, self.task.name, self.lease.ticket)
        except redis.RedisError:
            logger.debug("%s key=%r: whether it was superseded is not known", self.task.name, self.lease.key)
        return self._superseded

    def give_back_pool_slot(self) -> None:
        """The run's slot of its pool goes back, and the next waiting ticket takes it: once its key heard
        of its end (so no later message of the ticket starts) and before a retry of it goes out."""
        if self.task.serial_pool is not None:
            give_back_pool_slot(self.task.app, self.task.serial_pool, self.lease.key, self.lease.ticket)

    def let_go(self) -> None:
        """Stop renewing the lease without ending the run: a retry went out, or the process is going down."""
        current().leases.stop_renewing(self.lease)

    def _count_end(self, outcome: str) -> None:
        totals = current().totals
        totals.count("finished", self.task, outcome=outcome)
        totals.observe("run_seconds", self.task, time.monotonic() - self._began, outcome=outcome)

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
        gate = worker_gate()
        requeued, _ = outlast_restart(lambda: gate.requeue(lease))
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
        task, lease, gate = self.task, self.lease, worker_gate()
        end = self._end(status, error)
        keep_first_seconds, start_kept = handoff.local().keeping(task, gate)
        finish = Finish(
            lease.key, lease.ticket, lease.token, limit=task.serial_limit,
            outcome=Outcome(end.outcome_field, end.to_json()), block=status == Status.FAILED and task.blocks_on_failure,
            keep_first_seconds=keep_first_seconds, start_kept=start_kept, pool=task.serial_pool,
        )  # fmt: skip
        try:
            finished, retried = outlast_restart(lambda: gate.finish(finish))
        except redis.RedisError:
            logger.exception("finishing key=%r ticket=%s failed; its lease will expire", lease.key, lease.ticket)
            return True
        if finished.unwritten is not None:  # its row is not written yet: written once, as it ended
            end = ended_with_record(end, finished.unwritten)
        if not finished.ok and retried:
            # The first try may have gone through, its reply lost: then the ticket is done, or it blocks its key.
            snapshot = gate.inspect(lease.key, waiting_shown=0)
            if snapshot.blocks(lease.ticket):
                finished = FinishResult(Code.BLOCKED)
            elif lease.ticket not in snapshot.holders:
                logger.warning("finish of key=%r ticket=%s was applied before Redis went away", lease.key, lease.ticket)
                self.give_back_pool_slot()
                self._ended(end, status)
                self._publish_what_the_lost_reply_granted()
                return True
        if finished.code is Code.BLOCKED:
            logger.warning(
                "%s[%s] failed and blocks key=%r (on_failure='block'): nothing more of the key runs until "
                "an operator retries or cancels it", task.name, task.request.id, lease.key,
            )  # fmt: skip
            publish_grants(task.app, finished.granted)  # its pool slot went to them
            self._ended(end, status)
            return True
        if not finished.ok:
            self._fenced()
            return False
        self._ended(end, status)
        handoff.local().hand_over(task.app, task.request, finished.granted, runtime=time.monotonic() - self._began)
        return True

    def _end(self, status: str, error: str) -> Transition:
        """The run's end as its record takes it, merged with what this process buffered of the run. The
        gate keeps it until the record is written: a kill of this process after the finish loses nothing
        (the reaper writes it)."""
        task, request = self.task, self.task.request
        error = with_earlier(error, earlier_errors(request))
        end = self._transition(status, finished_at=timezone.now(), error=error)
        if status == Status.FAILED:
            try:
                end.message = self._stored_message()
            except Exception:  # what a retry needs is worth less than ending the run
                logger.warning("%s[%s]: its message is not kept for a retry", task.name, request.id, exc_info=True)
        buffered = current().recorder.peek(end.submission)
        end = buffered.merged_with(end) if buffered else end
        end.outcome_key = self.lease.key
        return end

    def _ended(self, end: Transition, status: str) -> None:
        current().recorder.buffer(end)
        self._count_end(status)

    def _publish_what_the_lost_reply_granted(self) -> None:
        """A finish applied whose reply was lost: what it granted was never published. Published now, not
        after the dispatch timeout; if a copy did go out, the first to start runs and the other is dropped.
        One it started for this process to keep is given back first, unstarted."""
        gate, lease = worker_gate(), self.lease
        kept = gate.kept_by(lease.key, lease.token)
        if kept:
            gate.requeue(Lease(lease.key, *kept), unstarted=True)  # the script checks it still runs unstarted
        snapshot = gate.inspect(lease.key, waiting_shown=0)
        granted = [t for t, holder in snapshot.holders.items() if holder.state == "granted"]
        publish_grants(self.task.app, [r for t in granted for r in gate.release(lease.key, t)])

    def _fenced(self) -> None:
        """The lease was lost and the reaper acted: the record follows the run it dispatched; this run is noted."""
        task, request, lease = self.task, self.task.request, self.lease
        logger.warning(
            "%s[%s] finished after losing its lease (fenced) key=%r ticket=%s",
            task.name, request.id, lease.key, lease.ticket,
        )  # fmt: skip
        current().totals.count("fenced", task)
        try:
            began = timezone.now() - timedelta(seconds=time.monotonic() - self._began)
            KeyedTask.objects.note_ran_on(
                cast(str, request.id), lease.key, lease.ticket, self.attempts, began, timezone.now()
            )
        except Exception:  # a note is worth less than ending the run
            logger.warning("%s[%s]: its run after losing its key is not noted", task.name, request.id, exc_info=True)

    def retry_in_place(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], options: dict[str, Any]
    ) -> AsyncResult[Any]:
        """``self.retry()``: keep the key held through the countdown; the retry runs next."""
        task, lease = self.task, self.lease
        countdown = options.get("countdown") or 0
        eta = options.get("eta")
        if isinstance(eta, datetime):
            countdown = max(0.0, (eta - timezone.now()).total_seconds())
        self.check_key(args, kwargs)  # a retry of another key's arguments would run outside its key
        options = send_options(task, args, kwargs, options)
        task_id = options.pop("task_id")
        # Celery's retry is called where the task caught its exception (or Celery did, for autoretry_for).
        exc = sys.exc_info()[1]
        error = failure_text(exc) if exc is not None else "retried"
        earlier = earlier_errors(task.request)
        options["headers"] = {**(options.get("headers") or {}), ERRORS_HEADER: carried(earlier, self.attempts, error)}

        def keep_slot_for_retry(message: TaskMessage, send_now: SendNow) -> None:
            gate, stored = worker_gate(), message.encode(task.serializer, blocks=task.blocks_on_failure)
            dispatch, _ = outlast_restart(lambda: gate.retry(lease, stored, countdown_seconds=countdown))
            if dispatch is None:
                logger.warning("retry of a fenced ticket dropped key=%r ticket=%s", lease.key, lease.ticket)
                current().totals.count("fenced", task)
                return
            self.retried = True
            self.give_back_pool_slot()  # before the retry goes out: it asks its pool again at its start
            self._count_end("retried")
            retrying = with_earlier(f"it retries after: {error}", earlier)
            current().recorder.buffer(self._transition(Status.RETRYING, error=retrying))
            send_now(ticket_header(lease.key, lease.ticket, dispatch))

        return send_to_gate(task.app, task, task_id, args, kwargs, options, keep_slot_for_retry)


def tag_error_reports(key: str, attempt: int) -> None:
    """What the run's error reports say besides Celery's: its key and attempt, as tags of the Sentry scope its
    task runs in (sentry-sdk's Celery integration gives each task one), where the project uses sentry-sdk."""
    sentry = sys.modules.get("sentry_sdk")  # never imported here: a project without it pays nothing
    if sentry is not None:
        sentry.set_tags({"keyed_queue.key": key, "keyed_queue.attempt": attempt})


def key_drift(task: KeyedTaskProtocol, key: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> InvalidKey | None:
    """The error of a run of ``key`` whose arguments make another key (or none); None if they make ``key``."""
    try:
        made_key = task.key_for(args, kwargs)
    except (InvalidKey, InvalidArguments) as exc:
        made = f"no key ({exc})"
    else:
        if made_key == key:  # every run's case: compared whole, before anything is formatted
            return None
        made = f"key {shown(made_key)}"
    return InvalidKey(
        f"{task.name}: its ticket is of key {shown(key)}, but its arguments as the worker has them make {made}: "
        "a key must be a function of the task's arguments alone (no clock, setting or database row), and of "
        "arguments that keep their form through the message (a tuple arrives as a list, a datetime as text)"
    )


def failure_text(exc: BaseException) -> str:
    """The error of a failed run, as its record keeps it: the exception, then its traceback."""
    trace = "".join(traceback.format_exception(exc)).rstrip()
    if len(trace) > TRACEBACK_CHARS:
        trace = "…" + trace[-TRACEBACK_CHARS:]
    return f"{type(exc).__name__}: {exc}\n\n{trace}"
