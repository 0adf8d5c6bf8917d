"""A run: one attempt of a keyed task in a worker process, from taking its slot to ending it.

``Run.begin`` starts the ticket its message names (or, for a delayed task now
due, takes one), ``finish`` ends it at the gate and dispatches what that
grants, and ``retry_in_place`` keeps the slot through ``self.retry()`` (an
attempt Celery kills ends in ``killed``). Every gate call here is made
after the fact, so each waits out a Redis restart (``outage``): giving up would
leave the key held until its lease expires.
"""

from __future__ import annotations

import logging
import sys
import time
import traceback
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

import redis
from celery.exceptions import Ignore, Reject
from django.utils import timezone

from ..conf import settings
from ..exceptions import InvalidArguments, InvalidKey
from ..gate import Code, FinishResult, Grant, KeptStart, Lease, Outcome, SubmitResult
from ..messaging import superseded
from ..messaging.building import SendNow, delivered, send_to_gate
from ..messaging.dispatch import publish, publish_grants
from ..messaging.message import (
    DELAY_OPTIONS,
    ENQUEUED_HEADER,
    HEADER,
    JOIN_HEADER,
    TaskMessage,
    gate_message,
    send_options,
    ticket_header,
)
from ..process.outage import outlast_restart, take_ticket
from ..process.state import current
from ..records.columns import shown
from ..records.models import KeyedTask
from ..records.statuses import Status
from ..records.submissions import ended_with_record
from ..records.transitions import Transition
from . import handoff
from .attempt_errors import ERRORS_HEADER, carried, earlier_errors, with_earlier

if TYPE_CHECKING:
    from celery.app.task import Context
    from celery.result import AsyncResult
    from kombu import Message

    from ..messaging.task_type import KeyedTaskProtocol


logger = logging.getLogger(__name__)

#: How much of a failed run's traceback its record keeps (the end of it, where the error is).
TRACEBACK_CHARS = 4000
#: How long ``Run.superseded`` answers from what it last read: a task may ask in a tight loop.
SUPERSEDED_READ_SECONDS = 0.1


class Run:
    def __init__(self, task: KeyedTaskProtocol, lease: Lease, attempts: int) -> None:
        self.task = task
        self.lease = lease
        self.attempts = attempts
        #: ``self.retry()`` handed the slot to the retry: this attempt's end finishes nothing.
        self.retried = False
        self._superseded, self._superseded_read_at = False, -SUPERSEDED_READ_SECONDS
        self._began = time.monotonic()

    @classmethod
    def begin(cls, task: KeyedTaskProtocol, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Run:
        """Take the slot the message's ticket was granted; raises Ignore when this message may not run."""
        request = task.request
        header = getattr(request, HEADER, None)
        lease, attempts = _join(task, args, kwargs) if header is None else _start(task, header, args, kwargs)
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
                {"started_at": now, "heartbeat_at": now, "worker": request.hostname or ""},
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
        process.leases.hold(lease, cast(str, request.id), attempts)
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
        return outlast_restart(lambda: process.gate.holds(self.lease))[0]

    def superseded(self) -> bool:
        """Whether a newer submission of this coalescing task waits behind this run: read from the gate
        at most every ``SUPERSEDED_READ_SECONDS``, and True for good once it was. False while Redis is
        out of reach (a hint: the run goes on)."""
        now = time.monotonic()
        if self._superseded or now - self._superseded_read_at < SUPERSEDED_READ_SECONDS:
            return self._superseded
        self._superseded_read_at = now
        try:
            self._superseded = current().gate.newer_waiting(self.lease.key, self.task.name, self.lease.ticket)
        except redis.RedisError:
            logger.debug("%s key=%r: whether it was superseded is not known", self.task.name, self.lease.key)
        return self._superseded

    def let_go(self) -> None:
        """Stop renewing the lease without ending the run: a retry went out, or the process is going down."""
        current().leases.stop_renewing(self.lease)

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
        if keeping and not task.serial_interval_ms and not task.serial_debounce_ms and task.max_recoveries > 0:
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

    def _count_end(self, outcome: str) -> None:
        totals = current().totals
        totals.count("finished", self.task, outcome=outcome)
        totals.observe("run_seconds", self.task, time.monotonic() - self._began, outcome=outcome)

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
            gate, stored = current().gate, message.encode(task.serializer, blocks=task.blocks_on_failure)
            dispatch, _ = outlast_restart(
                lambda: gate.retry(lease.key, lease.ticket, lease.token, stored, countdown_seconds=countdown)
            )
            if dispatch is None:
                logger.warning("retry of a fenced ticket dropped key=%r ticket=%s", lease.key, lease.ticket)
                current().totals.count("fenced", task)
                return
            self.retried = True
            self._count_end("retried")
            retrying = with_earlier(f"it retries after: {error}", earlier)
            current().recorder.buffer(self._transition(Status.RETRYING, error=retrying))
            send_now(ticket_header(lease.key, lease.ticket, dispatch))

        return send_to_gate(task.app, task, task_id, args, kwargs, options, keep_slot_for_retry)


def _start(
    task: KeyedTaskProtocol, header: dict[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Lease, int]:
    """Start the ticket the message's header names. Its arguments may make another key (``Run.check_key``):
    the gate starts only the ticket's own message (its task id), so a header copied onto another task's
    message is dropped, and a run whose own key function drifted fails holding its key."""
    request = task.request
    key, ticket = header["key"], int(header["ticket"])
    gate, dispatch = current().gate, int(header["dispatch"])
    kept = handoff.local().started(cast(str, request.id), key, ticket, dispatch)
    if kept is not None:  # the finish that kept it here started it
        return Lease(key, ticket, kept.token), kept.attempts
    started, _ = outlast_restart(
        lambda: gate.start(
            key,
            ticket,
            dispatch,
            max_lost=task.max_recoveries,
            block=task.blocks_on_failure,
            task_id=cast(str, request.id),
            interval_ms=task.serial_interval_ms,
        )  # fmt: skip
    )
    if started.code is Code.TOO_EARLY:
        # The key's rate: another process started one of its tasks since this message was sent.
        send_when_due(task, Grant(key, ticket, dispatch, started.message or b""), started.wait_seconds)
        raise Ignore()
    if not started.ok:
        # A duplicate is routine; a message that is not the ticket's own is not.
        log = logger.warning if started.code is Code.FOREIGN_MESSAGE else logger.info
        log("dropping message of %s[%s] key=%r ticket=%s: %s", task.name, request.id, key, ticket, started.code.name)
        current().totals.count("refused", task)
        raise Ignore()
    return Lease(key, ticket, started.token), started.attempts


def _join(task: KeyedTaskProtocol, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Lease, int]:
    """A message without a ticket (a delayed task now due, which its worker did not join): take one now."""
    request = task.request
    paced = task.serial_interval_ms > 0  # a granted ticket starts as any other, when its key's rate lets it
    key, submitted = join(task, request, args, kwargs, start=not paced, wait_out_outage=True)
    if paced and submitted is not None and submitted.granted:
        return _start(task, {"key": key, "ticket": submitted.ticket, "dispatch": 1}, args, kwargs)
    if submitted is None or not submitted.token:
        raise Ignore()  # a duplicate, or it waits for its key
    return Lease(key, submitted.ticket, submitted.token), 1


def send_when_due(task: KeyedTaskProtocol, grant: Grant, wait_seconds: float) -> None:
    """A granted ticket its key's rate does not let start yet: its message goes out again, for then.

    A worker holds it until then (Celery's ``eta``), in no pool process; if that message is lost,
    the reaper publishes the ticket again once its dispatch deadline, moved past then, passes.
    """
    logger.info(
        "%s key=%r ticket=%s starts in %.3fs (rate=%s)",
        task.name,
        grant.key,
        grant.ticket,
        wait_seconds,
        task.serial_rate,
    )
    publish(task.app, grant, mark_dispatched=False, countdown=wait_seconds)


def join(
    task: KeyedTaskProtocol,
    request: Context,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    start: bool,
    wait_out_outage: bool,
    received: Message | None = None,
) -> tuple[str, SubmitResult | None]:
    """A delayed task now due takes a ticket of its key: the key, and what the gate gave (None: a duplicate).

    ``request`` is the task's Celery request (a worker's, or the run's own). With
    ``start`` a granted ticket is started too. A ticket that must wait is recorded.
    ``received``, the kombu message as the worker received it, is stored as the
    message to publish when the ticket's turn comes.
    """
    key = task.key_for(args, kwargs)
    options = request_options(request)
    join_id = getattr(request, JOIN_HEADER, None) or request.id  # a message sent before there was one: its id
    # Carried by the message its grant publishes: that run's record is the join's (see ``Run.begin``).
    options["headers"] = {**(options.get("headers") or {}), JOIN_HEADER: join_id}
    sent = None if received is None else delivered(received, {**received.headers, JOIN_HEADER: join_id})
    message = gate_message(task.name, cast(str, request.id), args, kwargs, options, sent)
    submitted = take_ticket(
        current().gate,
        task.name,
        key,
        message.encode(task.serializer, blocks=task.blocks_on_failure),
        task_id=cast(str, request.id),
        wait_out_outage=wait_out_outage,
        limit=task.serial_limit,
        start=start,
        join_id=join_id,
        max_lost=task.max_recoveries,
        block=task.blocks_on_failure,
        coalesce=task.name if task.serial_coalesce else "",
    )
    if submitted is not None and submitted.superseded is not None:
        superseded.replaced(task, key, submitted.superseded[1], by=cast(str, request.id))
    if submitted is None:
        logger.info("dropping duplicate of %s[%s] key=%r", task.name, request.id, key)
    elif not submitted.granted:
        current().recorder.buffer(
            Transition(cast(str, request.id), key, submitted.ticket, Status.WAITING, 0, joins=True)
        )
    return key, submitted


def submitted_at(request: Context) -> float | None:
    """When the message's task was submitted (seconds since the epoch, by its producer's clock); None for a
    message without the submission's time (an operator's retry, or sent before it was stamped)."""
    enqueued = getattr(request, ENQUEUED_HEADER, None)
    if not isinstance(enqueued, int | float) or isinstance(enqueued, bool) or not 0 < enqueued < 1e11:
        return None
    return float(enqueued)


def waited_for_key(request: Context) -> float | None:
    """Seconds from the submission (or its eta, if later) to now, by its producer's clock; None for a
    message without the submission's time (an operator's retry, or sent before it was stamped)."""
    enqueued = submitted_at(request)
    if enqueued is None:
        return None
    eta = request.eta
    if isinstance(eta, str):
        try:
            eta = datetime.fromisoformat(eta)
        except ValueError:
            eta = None
    due = max(enqueued, eta.timestamp()) if isinstance(eta, datetime) else enqueued
    return max(0.0, time.time() - due)


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


def request_options(request: Context) -> dict[str, Any]:
    """The options a worker's ``request`` was sent with, as ``gate_message`` takes them (no delay: it is due)."""
    options = {k: v for k, v in request.as_execution_options().items() if k not in DELAY_OPTIONS}
    routing = request.delivery_info or {}
    if routing.get("routing_key"):
        options.setdefault("queue", routing["routing_key"])
    return options


def failure_text(exc: BaseException) -> str:
    """The error of a failed run, as its record keeps it: the exception, then its traceback."""
    trace = "".join(traceback.format_exception(exc)).rstrip()
    if len(trace) > TRACEBACK_CHARS:
        trace = "…" + trace[-TRACEBACK_CHARS:]
    return f"{type(exc).__name__}: {exc}\n\n{trace}"
