"""The Celery task base class of keyed serial tasks: hooks only.

The gate decides who may run; this class calls it at submission, before and
after running, and on retry, and hands the records their transitions.
"""

from __future__ import annotations

import inspect
import logging
import traceback
from collections.abc import Callable
from datetime import datetime, timedelta
from functools import cached_property, partial
from typing import Any

import redis
from celery import Task
from celery.exceptions import Ignore, Retry
from celery.utils import uuid
from django.db import IntegrityError, transaction
from django.utils import timezone

from . import handoff, idempotency, records
from .conf import settings
from .connection import TRANSIENT, get_gate, outlast_restart
from .dispatch import publish_grants, send
from .exceptions import GateUnavailable, InvalidArguments, InvalidKey, KeyQueueFull
from .gate import MAX_KEY_LENGTH, Code, Lease, NotSent, QueueFull, SubmitResult
from .leases import keeper
from .messages import HEADER, TaskMessage, portable_options
from .statuses import Status

logger = logging.getLogger(__name__)

_DELAY_OPTIONS = ("countdown", "eta")
#: How long a submission whose reply was lost keeps asking the gate for its ticket before it fails.
SUBMIT_RETRY_SECONDS = 5.0


class KeyedSerialTask(Task):
    """Tasks sharing a key run one at a time (``serial_limit`` at a time), in submission order."""

    #: A ``str.format`` template over the task's arguments, or a callable taking them.
    serial_key: str | Callable[..., str] = ""
    #: How many tasks of one key may run at once.
    serial_limit: int = 1
    #: How many times a run whose worker was lost (its lease expired) is dispatched
    #: again; after that the task is failed and its key passes on.
    max_recoveries: int = 3
    #: A duplicate submission (same task, same arguments) within the idempotency
    #: window returns the original task instead of running again.
    idempotent: bool = False
    #: Most tasks that may wait behind one key; a submission past it raises KeyQueueFull.
    #: None: ``KEYED_QUEUE_MAX_WAITING`` (no limit unless set).
    max_waiting: int | None = None
    #: The worker's request: ends the attempt its hard time limit kills, and only that one.
    Request = "django_keyed_queue.request:KeyedRequest"

    # -- submission -------------------------------------------------------

    def apply_async(self, args=None, kwargs=None, *, idempotency_key: str | None = None, **options):  # type: ignore[override]
        """Celery's ``apply_async``, through the key's queue: returns at once, whether the key is free or busy.

        The key and arguments are checked first (``InvalidKey``, ``InvalidArguments``,
        ``KeyQueueFull``: nothing is written). ``idempotency_key`` makes a duplicate
        within ``KEYED_QUEUE_IDEMPOTENCY_TTL_SECONDS`` return the original task.
        A ``countdown`` or ``eta`` task joins its key's queue when it is due.
        """
        args, kwargs = tuple(args or ()), dict(kwargs or {})
        if self.app.conf.task_always_eager:
            return super().apply_async(args, kwargs, **options)
        lease = getattr(self.request, "keyed_lease", None)
        if lease is not None and options.get("task_id") == self.request.id:
            return self._retry_in_place(lease, args, kwargs, options)
        return self._submit(args, kwargs, options, idempotency_key)

    def _bind(self, args: tuple, kwargs: dict) -> inspect.BoundArguments:
        try:
            bound = self._signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise InvalidArguments(f"{self.name}: {exc}") from exc
        bound.apply_defaults()
        return bound

    def key_for(self, args: tuple, kwargs: dict, bound: inspect.BoundArguments | None = None) -> str:
        """This task's key for these arguments; raises InvalidKey or InvalidArguments."""
        bound = bound or self._bind(args, kwargs)
        spec = self.serial_key
        try:
            key = spec.format(**bound.arguments) if isinstance(spec, str) else spec(*args, **kwargs)
        except Exception as exc:
            raise InvalidKey(f"{self.name}: cannot make the key from {spec!r}: {exc!r}") from exc
        if not isinstance(key, str):
            raise InvalidKey(f"{self.name}: the key must be a str, got {type(key).__name__}: {key!r}")
        if not key:
            raise InvalidKey(f"{self.name}: the key is empty")
        try:
            key.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidKey(f"{self.name}: the key is not valid text: {exc}") from exc
        if len(key) > MAX_KEY_LENGTH:
            raise InvalidKey(
                f"{self.name}: the key is {len(key)} characters long, over the maximum of {MAX_KEY_LENGTH}"
            )
        return key

    @cached_property
    def _signature(self) -> inspect.Signature:
        return inspect.signature(self.run)

    def _submit(self, args: tuple, kwargs: dict, options: dict, idempotency_key: str | None):
        bound = self._bind(args, kwargs)
        key = self.key_for(args, kwargs, bound)
        task_id = options.pop("task_id", None) or uuid()
        options = self._send_options(args, kwargs, options)
        expires = options.get("expires")
        if isinstance(expires, (int, float)) and not isinstance(expires, bool):
            # Counted from now, as Celery does; not from when a parked task is finally published.
            options["expires"] = timezone.now() + timedelta(seconds=expires)
        stored = portable_options(options, drop=_DELAY_OPTIONS)
        message = TaskMessage(self.name, task_id, args, kwargs, stored).encode(
            options.get("serializer") or self.serializer
        )
        limit = settings.MAX_MESSAGE_BYTES
        if limit and len(message) > limit:
            raise InvalidArguments(
                f"{self.name}: the task message is {len(message)} bytes, over KEYED_QUEUE_MAX_MESSAGE_BYTES "
                f"({limit}); pass a reference to large data instead of the data"
            )
        fingerprint, claimed_with = None, {}
        if idempotency_key is not None:
            fingerprint = idempotency.explicit_fingerprint(self.name, idempotency_key)
            claimed_with = {
                "key": idempotency_key,
                "arguments": idempotency.arguments_digest(self.name, bound.arguments),
            }
        elif self.idempotent:
            fingerprint = idempotency.arguments_fingerprint(self.name, bound.arguments)
        if fingerprint is not None:
            original = idempotency.claim(fingerprint, self.name, task_id, **claimed_with)
            if original is not None:
                logger.debug("duplicate of %s[%s] key=%r: returning the original", self.name, original, key)
                return self.AsyncResult(original)
        try:
            return self._enqueue(key, task_id, message, args, kwargs, options)
        except BaseException:
            if fingerprint is not None:
                idempotency.release(fingerprint, task_id)
            raise

    def _send_options(self, args: tuple, kwargs: dict, options: dict) -> dict:
        """The options ``Task.apply_async`` would publish with: the task's own under the caller's.

        Stored with the message, so that any process can publish it by name.
        """
        sent = {name: value for name, value in self._get_exec_options().items() if value is not None}
        sent.update(options)
        sent.setdefault("ignore_result", self.ignore_result)
        if sent.get("shadow") is None:
            sent["shadow"] = self.shadow_name(args, kwargs, options)
        return sent

    def _enqueue(self, key: str, task_id: str, message: bytes, args: tuple, kwargs: dict, options: dict):
        """Take the ticket, write the record and, if granted, publish: nothing left behind on failure."""
        delayed = any(options.get(name) is not None for name in _DELAY_OPTIONS)
        row = {
            "task_id": task_id,
            "task_name": self.name,
            "key": key,
            "arguments": records.describe_arguments(self.name, args, kwargs),
            "message": message.decode(),
        }
        if delayed:
            # A delayed task joins its key's queue when due, on the worker (see __call__).
            with transaction.atomic():
                records.record_submission(status=Status.WAITING, due_at=_due_at(options), **row)
                super().apply_async(args, kwargs, task_id=task_id, **options)
            return self.AsyncResult(task_id)

        try:
            submitted = self._take_ticket(key, task_id, message)
        except QueueFull as full:
            raise KeyQueueFull(
                f"{self.name}: key {key!r} has {full.waiting} tasks waiting, the most it may have "
                f"(max_waiting={self._max_waiting}); nothing was submitted"
            ) from full
        except redis.RedisError as exc:
            raise GateUnavailable(f"{self.name}: the keyed queue's Redis is unreachable: {exc}") from exc
        assert submitted is not None  # only joins can be duplicates
        try:
            records.record_submission(
                ticket=submitted.ticket,
                status=Status.DISPATCHED if submitted.granted else Status.WAITING,
                dispatched_at=timezone.now() if submitted.granted else None,
                **row,
            )
        except BaseException as exc:
            # Nobody saw the ticket: its number can be given back.
            self._withdraw(key, submitted.ticket, forget=True)
            if isinstance(exc, IntegrityError):
                raise InvalidArguments(f"{self.name}: task_id {task_id!r} is already used by another task") from exc
            raise
        if not submitted.granted:
            return self.AsyncResult(task_id)
        try:
            # Celery's own result: dropping it and making another would unsubscribe and resubscribe.
            return self._publish(key, submitted.ticket, 1, args, kwargs, {**options, "task_id": task_id})
        except BaseException as exc:
            # The message may have left before the error: keep the number so it can never start another.
            try:
                self._withdraw(key, submitted.ticket, forget=False)
            except redis.RedisError as gate_error:
                # The ticket keeps its message and its record: the reaper publishes it again.
                raise GateUnavailable(
                    f"{self.name}: publishing failed ({exc!r}) and the keyed queue's Redis is unreachable, "
                    f"so the task stays queued and may still run: {gate_error}"
                ) from exc
            records.forget_submission(task_id)
            raise

    @property
    def _max_waiting(self) -> int:
        limit = self.max_waiting if self.max_waiting is not None else settings.MAX_WAITING
        return limit or 0

    def _take_ticket(self, key: str, task_id: str, message: bytes) -> SubmitResult | None:
        gate = get_gate()
        submit = partial(
            gate.submit, key, message, limit=self.serial_limit, task_id=task_id, max_waiting=self._max_waiting
        )
        try:
            return submit()
        except NotSent:
            raise  # Redis is down: nothing was taken, fail at once
        except TRANSIENT:
            # The connection broke after the call was sent: the ticket may be taken, its reply
            # lost. Ask again for a while; the gate returns the ticket this message holds.
            logger.warning("submitting to key=%r lost its reply; asking the gate again", key)
        try:
            return outlast_restart(partial(submit, retried=True), seconds=SUBMIT_RETRY_SECONDS)[0]
        except redis.RedisError as exc:
            raise GateUnavailable(
                f"{self.name}: the keyed queue's Redis went away during the submission, which may have "
                f"been queued and may still run: {exc}"
            ) from exc

    def _withdraw(self, key: str, ticket: int, *, forget: bool) -> None:
        withdrawn = get_gate().cancel(key, ticket, limit=self.serial_limit, forget=forget)
        publish_grants(self.app, withdrawn.granted)

    def _publish(self, key: str, ticket: int, dispatch: int, args: tuple, kwargs: dict, options: dict):
        options = dict(options)
        message = TaskMessage(self.name, options.pop("task_id"), args, kwargs, options)
        return send(self.app, message, key, ticket, dispatch, task=self)

    def _retry_in_place(self, lease: Lease, args: tuple, kwargs: dict, options: dict):
        """``self.retry()``: keep the key held through the countdown; the retry runs next."""
        countdown = options.get("countdown") or 0
        eta = options.get("eta")
        if isinstance(eta, datetime):
            countdown = max(0.0, (eta - timezone.now()).total_seconds())
        options = self._send_options(args, kwargs, options)
        stored = portable_options(options, drop=(*_DELAY_OPTIONS, "task_id"))
        message = TaskMessage(self.name, options["task_id"], args, kwargs, stored).encode(self.serializer)
        gate = get_gate()
        dispatch, _ = outlast_restart(
            lambda: gate.retry(lease.key, lease.ticket, lease.token, message, countdown_seconds=countdown)
        )
        if dispatch is None:
            logger.warning("retry of a fenced ticket dropped key=%r ticket=%s", lease.key, lease.ticket)
            return self.AsyncResult(options["task_id"])
        self.request.keyed_retried = True
        records.record(options["task_id"], Status.RETRYING, self.request.keyed_attempts)
        return self._publish(lease.key, lease.ticket, dispatch, args, kwargs, dict(options))

    # -- execution --------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request
        if request.called_directly or request.is_eager:
            return self.run(*args, **kwargs)
        header = getattr(request, HEADER, None)
        lease, attempts = self._join(args, kwargs) if header is None else self._start(header, args, kwargs)
        request.keyed_lease, request.keyed_attempts, request.keyed_retried = lease, attempts, False
        now = timezone.now()
        records.record(
            request.id,
            Status.RUNNING,
            attempts,
            create={"task_name": self.name, "key": lease.key, "args": args, "kwargs": kwargs, "enqueued_at": now},
            ticket=lease.ticket,
            started_at=now,
            heartbeat_at=now,
            worker=request.hostname or "",
        )
        keeper.hold(lease)
        try:
            result = self.run(*args, **kwargs)
        except Retry:
            keeper.release(lease)
            raise
        except Exception as exc:
            if not self._finish(lease, Status.FAILED, attempts, error=_failure(exc)):
                raise Ignore() from exc  # see below
            raise
        except BaseException:
            keeper.release(lease)  # the process is going down; the lease expires and is reaped
            raise
        if not self._finish(lease, Status.SUCCEEDED, attempts):
            # Fenced: another attempt holds the key and will store the task's result. Celery stores
            # none for an ignored run, so a caller waiting on the result never sees this one's.
            raise Ignore()
        return result

    @property
    def keyed_lease(self) -> Lease | None:
        """The running task's lease; ``keyed_lease.token`` is its fencing token."""
        return getattr(self.request, "keyed_lease", None)

    def holds_key(self) -> bool:
        """True while this run still holds its key: its lease was not lost (one round trip).

        Check it before a write that must not happen twice, or store
        ``keyed_lease.token`` with the write and refuse smaller tokens.
        """
        lease = self.keyed_lease
        if lease is None or keeper.is_lost(lease):
            return False
        gate = get_gate()
        return outlast_restart(lambda: gate.holds(lease))[0]

    def _start(self, header: dict, args: tuple, kwargs: dict) -> tuple[Lease, int]:
        key, ticket = header["key"], int(header["ticket"])
        if self.key_for(args, kwargs) != key:
            # A header copied onto other arguments: never let it take another key's ticket.
            logger.warning(
                "refusing message of %s[%s]: its header names key=%r ticket=%s, its arguments another key",
                self.name,
                self.request.id,
                key,
                ticket,
            )
            raise Ignore()
        gate = get_gate()
        started, _ = outlast_restart(
            lambda: gate.start(
                key, ticket, int(header["dispatch"]), max_lost=self.max_recoveries, task_id=self.request.id
            )
        )
        if not started.ok:
            # A duplicate is routine; a message that is not the ticket's own is not.
            log = logger.warning if started.code is Code.FOREIGN_MESSAGE else logger.info
            log(
                "dropping message of %s[%s] key=%r ticket=%s: %s",
                self.name,
                self.request.id,
                key,
                ticket,
                started.code.name,
            )
            raise Ignore()
        return Lease(key, ticket, started.token), started.attempts

    def _join(self, args: tuple, kwargs: dict) -> tuple[Lease, int]:
        """A message without a ticket (a delayed task now due): take a ticket now."""
        request = self.request
        key = self.key_for(args, kwargs)
        options = {k: v for k, v in request.as_execution_options().items() if k != "task_id" and v is not None}
        routing = request.delivery_info or {}
        if routing.get("routing_key"):
            options.setdefault("queue", routing["routing_key"])
        message = TaskMessage(self.name, request.id, args, kwargs, portable_options(options)).encode(self.serializer)
        submitted = get_gate().submit(
            key, message, limit=self.serial_limit, start=True, join_id=request.id, max_lost=self.max_recoveries
        )
        if submitted is None:
            logger.info("dropping duplicate of %s[%s] key=%r", self.name, request.id, key)
            raise Ignore()
        if not submitted.token:
            records.record(request.id, Status.WAITING, 0, ticket=submitted.ticket)
            raise Ignore()
        return Lease(key, submitted.ticket, submitted.token), 1

    def _finish(self, lease: Lease, status: str, attempts: int, error: str = "") -> bool:
        """End the run at the gate; False if this attempt no longer held its key (fenced)."""
        keeper.release(lease)
        if self.request.keyed_retried:
            return True  # self.retry() handed the slot to the retry (also with throw=False)
        finished_at = timezone.now()
        gate = get_gate()
        # The gate keeps the run's outcome until its record is written: a kill of this process
        # after the finish loses nothing (the reaper writes it).
        end = records.end_of_run(self.request.id, status, attempts, finished_at=finished_at, error=error)
        outcome = (self.request.id, end.to_json())
        try:
            finished, retried = outlast_restart(
                lambda: gate.finish(lease.key, lease.ticket, lease.token, limit=self.serial_limit, outcome=outcome)
            )
        except redis.RedisError:
            logger.exception("finishing key=%r ticket=%s failed; its lease will expire", lease.key, lease.ticket)
            return True
        if not finished.ok and retried and not gate.inspect(lease.key, waiting_shown=0)["holders"].get(lease.ticket):
            # The first try went through but its reply was lost: the ticket is done. Whatever it
            # granted was not published; the dispatch timeout publishes it.
            logger.warning("finish of key=%r ticket=%s was applied before Redis went away", lease.key, lease.ticket)
            records.record_end(end, lease.key)
            return True
        if not finished.ok:
            # The lease was lost and the reaper acted: the record follows the run it dispatched.
            logger.warning(
                "%s[%s] finished after losing its lease (fenced) key=%r ticket=%s",
                self.name,
                self.request.id,
                lease.key,
                lease.ticket,
            )
            return False
        records.record_end(end, lease.key)
        publish_grants(self.app, handoff.keep(self.app, self.request, finished.granted))
        return True


#: How much of a failed run's traceback its record keeps (the end of it, where the error is).
TRACEBACK_CHARS = 4000


def _failure(exc: BaseException) -> str:
    """The error of a failed run, as its record keeps it: the exception, then its traceback."""
    trace = "".join(traceback.format_exception(exc)).rstrip()
    if len(trace) > TRACEBACK_CHARS:
        trace = "…" + trace[-TRACEBACK_CHARS:]
    return f"{type(exc).__name__}: {exc}\n\n{trace}"


def _due_at(options: dict) -> datetime:
    eta = options.get("eta")
    if eta is not None:
        eta = datetime.fromisoformat(eta) if isinstance(eta, str) else eta
        return timezone.make_aware(eta) if timezone.is_naive(eta) else eta
    return timezone.now() + timedelta(seconds=float(options["countdown"]))
