"""The producer's submission: check, claim idempotency, and Celery sends the message to the gate, which
takes a ticket, keeps the record for the row (``records.submissions`` writes it) and publishes it if granted.

Nothing is left behind when a step fails: no ticket, no row, no message, no claim.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any, TypeVar

import redis
from celery.utils import uuid
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.utils import timezone

from ..conf import settings
from ..exceptions import GateUnavailable, InvalidArguments, KeyQueueFull
from ..gate import Gate, NotSent, QueueFull, Submission, SubmitResult
from ..records import idempotency, submissions
from ..records.columns import TASK_ID_MAX_LENGTH, TASK_NAME_MAX_LENGTH, shown, unstorable
from ..records.models import KeyedTask
from ..records.statuses import Status
from ..records.transitions import describe_arguments
from .dispatch import publish_grants
from .messages import JOIN_HEADER, TaskMessage, gate_message, is_delayed, send_options, ticket_header
from .outage import TRANSIENT, outlast_restart
from .process import current
from .sending import publish_stored, send

logger = logging.getLogger(__name__)

#: How long a submission whose reply was lost keeps asking the gate for its ticket before it fails.
SUBMIT_RETRY_SECONDS = 5.0

T = TypeVar("T")


@dataclass(frozen=True)
class Checked:
    """A submission checked, with nothing written: what it sends, its key and its idempotency claim."""

    task_id: str
    args: tuple
    kwargs: dict
    #: As ``messages.send_options`` gives them.
    options: dict
    key: str
    fingerprint: str | None
    claimed_with: dict


def checked_key(
    task, args: tuple, kwargs: dict, serializer: str | None
) -> tuple[tuple, dict, inspect.BoundArguments, str]:
    """The arguments as sent, bound, and their key; raises ``InvalidArguments`` or ``InvalidKey``.

    ``pydantic=True`` tasks (Celery 5.7+) send their models as dicts, as Celery's
    ``apply_async`` does, and the key is made from the arguments as sent, because
    that is what the worker holds when it checks the message's key.
    """
    bound = task._bind(args, kwargs)
    dump = getattr(task, "_dump_pydantic_arguments", None)
    if dump is not None and serializer != "pickle":
        args, kwargs = dump(args, kwargs)
        args, bound = tuple(args), task._bind(args, kwargs)
    return args, kwargs, bound, task.key_for(args, kwargs, bound)


def check(task, args: tuple, kwargs: dict, options: dict, idempotency_key: str | None) -> Checked:
    """Everything a submission checks before it writes anything (``KeyedQueueError`` on bad input)."""
    if task.soft_time_limit and task.time_limit and task.soft_time_limit > task.time_limit:
        raise ValueError("soft_time_limit must be less than or equal to time_limit")  # as Celery's apply_async
    task_id = options.pop("task_id", None) or uuid()
    check_storable(task, task_id, options)
    options = send_options(task, args, kwargs, options)
    args, kwargs, bound, key = checked_key(task, args, kwargs, options.get("serializer"))
    if is_delayed(options):
        options["headers"] = {**(options.get("headers") or {}), JOIN_HEADER: uuid()}
    fingerprint, claimed_with = None, {}
    if idempotency_key is not None:
        fingerprint = idempotency.explicit_fingerprint(task.name, idempotency_key)
        claimed_with = {
            "key": idempotency_key,
            "arguments": idempotency.arguments_digests(task.name, bound.arguments),
        }
    elif task.idempotent:
        fingerprint = idempotency.arguments_fingerprint(task.name, bound.arguments)
    return Checked(task_id, args, kwargs, options, key, fingerprint, claimed_with)


def check_storable(task, task_id: object, options: dict) -> None:
    """Refuse what the submission's record could not hold on some supported database (``InvalidArguments``
    naming the field): the key is checked with the arguments, an idempotency key when it is claimed."""
    fields = {
        "task name": (task.name, TASK_NAME_MAX_LENGTH),
        "task_id": (task_id, TASK_ID_MAX_LENGTH),
        # Shown in the record's arguments instead of them (cut to their length there).
        **{name: (options[name], None) for name in ("argsrepr", "kwargsrepr") if isinstance(options.get(name), str)},
    }
    for field, (value, max_length) in fields.items():
        problem = unstorable(value, max_length)
        if problem:
            named = task.name if field != "task name" else "a keyed task"
            raise InvalidArguments(f"{named}: {field} {shown(value)} {problem}")


def submit(task, args: tuple, kwargs: dict, options: dict, idempotency_key: str | None, *, claimed: bool = False):
    """``task.apply_async(args, kwargs, **options)`` through the key's queue; the task's AsyncResult.

    ``claimed``: the idempotency key was claimed for this task id already (``submit_on_commit``).
    """
    checked = check(task, args, kwargs, options, idempotency_key)
    fingerprint, task_id, key = checked.fingerprint, checked.task_id, checked.key
    if fingerprint is not None and not claimed:
        original = idempotency.claim(fingerprint, task.name, task_id, **checked.claimed_with)
        if original is not None:
            logger.debug("duplicate of %s[%s] key=%r: returning the original", task.name, original, key)
            return task.AsyncResult(original)
    args, kwargs, options = checked.args, checked.kwargs, checked.options
    try:
        if is_delayed(options):
            return _delay(task, key, task_id, args, kwargs, options)
        return _enqueue(task, key, task_id, args, kwargs, options)
    except BaseException:
        if fingerprint is not None:
            idempotency.release(fingerprint, task_id)
        raise


def in_transaction(using: str | None = None) -> bool:
    """The caller is inside ``transaction.atomic()`` on database ``using`` (the default database)."""
    return connections[using or DEFAULT_DB_ALIAS].in_atomic_block


def submit_on_commit(task, args: tuple, kwargs: dict, options: dict, idempotency_key: str | None):
    """``task.apply_async(...)`` once the caller's transaction commits (at once outside one): the ticket
    is taken then, so tasks of one key run in commit order, and a rollback leaves nothing.

    Bad input raises now, inside the transaction. An idempotency key is claimed
    now when the records live in the transaction's database, so that the claim
    commits or rolls back with it and a duplicate returns the original at once;
    else it is claimed at commit. Returns the AsyncResult the task will have.
    """
    if not in_transaction():
        return task.apply_async(args, kwargs, idempotency_key=idempotency_key, **options)
    options = dict(options)
    checked = check(task, args, kwargs, dict(options), idempotency_key)
    gate_message(task.name, checked.task_id, checked.args, checked.kwargs, checked.options).encode(task.serializer)
    options["task_id"] = checked.task_id
    if task.app.conf.task_always_eager:  # Celery's eager run, at commit
        transaction.on_commit(partial(task.apply_async, args, kwargs, **options))
        return task.AsyncResult(checked.task_id)
    claimed = False
    if checked.fingerprint is not None and idempotency.database() == DEFAULT_DB_ALIAS:
        original = idempotency.claim(checked.fingerprint, task.name, checked.task_id, **checked.claimed_with)
        if original is not None:
            return task.AsyncResult(original)
        claimed = True
    logger.debug("%s[%s] key=%r is submitted when the transaction commits", task.name, checked.task_id, checked.key)
    transaction.on_commit(partial(submit, task, args, kwargs, options, idempotency_key, claimed=claimed))
    return task.AsyncResult(checked.task_id)


def _delay(task, key: str, task_id: str, args: tuple, kwargs: dict, options: dict):
    """A delayed task joins its key's queue when due, on the worker (see ``request.KeyedRequest``)."""
    message = gate_message(task.name, task_id, args, kwargs, options)
    with transaction.atomic(using=KeyedTask.objects.db_for_write()):
        row = _row(task, key, message, options)
        KeyedTask.objects.insert_submission(status=Status.WAITING, due_at=_due_at(options), **row)
        return task.send_plain(args, kwargs, task_id=task_id, **options)


def _enqueue(task, key: str, task_id: str, args: tuple, kwargs: dict, options: dict):
    """Celery builds and sends the message; to the gate, which takes its ticket, keeps its record and,
    if granted, publishes it: nothing left behind on failure."""

    def to_gate(message: TaskMessage, send_now) -> None:
        sub = _submission(task, key, message, options)
        try:
            submitted = take_ticket(
                current().gate, task.name, key, sub.message, task_id=task_id, limit=sub.limit,
                max_waiting=sub.max_waiting, record=sub.record,
            )  # fmt: skip
        except QueueFull as full:
            raise _queue_full(task, full, sub, "; nothing was submitted") from full
        except redis.RedisError as exc:
            raise GateUnavailable(f"{task.name}: the keyed queue's Redis is unreachable: {exc}") from exc
        assert submitted is not None  # only joins can be duplicates
        if not submitted.granted:
            return
        try:
            send_now(ticket_header(key, submitted.ticket, 1))
        except BaseException as exc:
            # The message may have left before the error: keep the number so it can never start another.
            try:
                withdraw(task, key, submitted.ticket)
            except redis.RedisError as gate_error:
                # The ticket keeps its message and its record: the reaper publishes it again.
                raise GateUnavailable(
                    f"{task.name}: publishing failed ({exc!r}) and the keyed queue's Redis is unreachable, "
                    f"so the task stays queued and may still run: {gate_error}"
                ) from exc
            raise

    return send(task.app, task, task_id, args, kwargs, options, to_gate)


def submit_many(
    task, calls: Iterable[Any], options: dict, idempotency_keys: Iterable[str | None] | None, batch_size: int
) -> list:
    """``apply_async`` of each call, with one gate round trip per ``batch_size`` calls; their AsyncResults.

    A call is a tuple of positional arguments or a dict of keyword arguments.
    Every call is checked and its message built before anything is written; a
    key's tasks take their tickets in the order of ``calls``.
    """
    calls = list(calls)
    keys = [None] * len(calls) if idempotency_keys is None else list(idempotency_keys)
    if len(keys) != len(calls):
        raise InvalidArguments(f"{task.name}: {len(keys)} idempotency keys for {len(calls)} calls")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"{task.name}: batch_size must be an int >= 1, got {batch_size!r}")
    if options.get("task_id") is not None:
        raise InvalidArguments(f"{task.name}: task_id names one task; each call of a bulk submission gets its own")
    arguments = [_call_arguments(task, call) for call in calls]
    checked = [check(task, *call, dict(options), key) for call, key in zip(arguments, keys, strict=True)]
    if task.app.conf.task_always_eager or (settings.SUBMIT_ON_COMMIT and in_transaction()):
        # Celery's eager runs, or submissions at the commit: one by one, as apply_async makes them.
        return [
            task.apply_async(*call, idempotency_key=key, task_id=c.task_id, **options)
            for call, c, key in zip(arguments, checked, keys, strict=True)
        ]
    if is_delayed(options):  # each joins its key's queue when due, as one submission does
        return [
            submit(task, *call, {**options, "task_id": c.task_id}, key)
            for call, c, key in zip(arguments, checked, keys, strict=True)
        ]
    prepared = [_prepared(task, c) for c in checked]
    results: list = []
    with task.app.producer_or_acquire(options.get("producer")) as producer:
        for start in range(0, len(prepared), batch_size):
            results += _submit_batch(task, prepared[start : start + batch_size], producer, submitted=len(results))
    return results


def _call_arguments(task, call: Any) -> tuple[tuple, dict]:
    if isinstance(call, dict):
        return (), call
    if isinstance(call, (tuple, list)):
        return tuple(call), {}
    raise InvalidArguments(
        f"{task.name}: a call of a bulk submission is a tuple of positional arguments or a dict of "
        f"keyword arguments, got {type(call).__name__}"
    )


@dataclass
class _Prepared:
    checked: Checked
    message: TaskMessage
    submission: Submission
    result: Any
    claimed: bool = False


def _prepared(task, checked: Checked) -> _Prepared:
    """A checked call with the message Celery builds for it (the publish signals fire now), stored form checked."""
    built: list[TaskMessage] = []
    result = send(
        task.app, task, checked.task_id, checked.args, checked.kwargs, checked.options,
        lambda message, send_now: built.append(message),
    )  # fmt: skip
    return _Prepared(checked, built[0], _submission(task, checked.key, built[0], checked.options), result)


def _submit_batch(task, batch: list[_Prepared], producer: Any, *, submitted: int) -> list:
    """Claim idempotency keys, take the batch's tickets in one round trip, publish the granted; the results.

    If a step fails, what it had not yet published is withdrawn, and the error
    says how many of the calls (``submitted`` before this batch) went in.
    """
    results, sending = [], []
    for item in batch:
        c = item.checked
        original = c.fingerprint and idempotency.claim(c.fingerprint, task.name, c.task_id, **c.claimed_with)
        if original:
            results.append(task.AsyncResult(original))
            continue
        item.claimed = c.fingerprint is not None
        results.append(item.result)
        sending.append(item)
    try:
        outcomes = _take_tickets(task, [item.submission for item in sending])
    except BaseException:
        _release_claims(sending)
        raise
    for i, (item, outcome) in enumerate(zip(sending, outcomes, strict=True)):
        key = item.submission.key
        try:
            if isinstance(outcome, QueueFull):
                raise _queue_full(task, outcome, item.submission)
            if outcome.granted:
                publish_stored(task.app, item.message, ticket_header(key, outcome.ticket, 1), producer)
        except BaseException as exc:
            later = list(zip(sending[i:], outcomes[i:], strict=True))
            # The last first: none is granted in another's place, and unseen tickets give their numbers back.
            for unsent, taken in reversed(later):
                if not isinstance(taken, QueueFull):
                    withdraw(task, unsent.submission.key, taken.ticket, forget=unsent is not item)
            _release_claims([unsent for unsent, _ in later])
            went_in = submitted + results.index(item.result)
            exc.add_note(f"the first {went_in} calls of the bulk submission were submitted, the rest were not")
            raise
    return results


def _take_tickets(task, batch: list[Submission]) -> list:
    """``Gate.submit_many``, asked again when a lost reply may hide tickets taken."""
    call = partial(current().gate.submit_many, batch)
    try:
        return asked_again(call, f"{task.name}: a bulk submission of {len(batch)} calls")
    except NotSent as exc:
        raise GateUnavailable(f"{task.name}: the keyed queue's Redis is unreachable: {exc}") from exc


def _release_claims(items: list[_Prepared]) -> None:
    for item in items:
        if item.claimed and item.checked.fingerprint is not None:
            idempotency.release(item.checked.fingerprint, item.checked.task_id)


def _submission(task, key: str, message: TaskMessage, options: dict) -> Submission:
    """What the gate takes for a submission of ``task``: its stored message, its record, its key's limits."""
    row = _row(task, key, message, options)
    return Submission(
        key, row["message"].encode(), message.task_id,
        record=submissions.record(message.task_id, task.name, row["arguments"]),
        limit=task.serial_limit, max_waiting=waiting_limit(task),
    )  # fmt: skip


def _queue_full(task, full: QueueFull, submission: Submission, then: str = "") -> KeyQueueFull:
    return KeyQueueFull(
        f"{task.name}: key {submission.key!r} has {full.waiting} tasks waiting, the most it may have "
        f"(max_waiting={submission.max_waiting}){then}"
    )


def _row(task, key: str, message: TaskMessage, options: dict) -> dict:
    """The submission's record, its stored message encoded (refused if too large)."""
    encoded = message.encode(task.serializer, blocks=task.blocks_on_failure)
    limit = settings.MAX_MESSAGE_BYTES
    if limit and len(encoded) > limit:
        raise InvalidArguments(
            f"{task.name}: the task message is {len(encoded)} bytes, over KEYED_QUEUE_MAX_MESSAGE_BYTES "
            f"({limit}); pass a reference to large data instead of the data"
        )
    return {
        "task_id": message.task_id,
        "task_name": task.name,
        "key": key,
        "arguments": describe_arguments(
            task.name,
            message.args,
            message.kwargs,
            argsrepr=options.get("argsrepr"),
            kwargsrepr=options.get("kwargsrepr"),
        ),
        "message": encoded.decode(),
    }


def waiting_limit(task) -> int:
    """Most tickets that may wait behind the task's key (0: no limit)."""
    limit = task.max_waiting if task.max_waiting is not None else settings.MAX_WAITING
    return limit or 0


def take_ticket(
    gate: Gate,
    task_name: str,
    key: str,
    message: bytes,
    *,
    task_id: str,
    wait_out_outage: bool = False,
    **submit_options: Any,
) -> SubmitResult | None:
    """Take a ticket of ``key`` for ``message``: the submission of a producer, or a delayed task's join.

    A reply lost with the connection may hide a ticket taken: the gate is asked
    again, and returns the ticket this message holds. A producer (the default)
    fails at once when Redis is down and asks again for ``SUBMIT_RETRY_SECONDS``;
    a worker (``wait_out_outage``) waits out a restart, as for every call after the fact.
    """
    call = partial(gate.submit, key, message, task_id=task_id, **submit_options)
    return asked_again(call, f"{task_name}: submitting to key={key!r}", wait_out_outage=wait_out_outage)


def asked_again(call: Callable[..., T], what: str, *, wait_out_outage: bool = False) -> T:
    """``call()``; if its reply was lost, ``call(retried=True)`` until Redis answers (see ``take_ticket``)."""
    try:
        return call()
    except NotSent:
        if not wait_out_outage:
            raise  # Redis is down: nothing was taken, fail at once
    except TRANSIENT:
        logger.warning("%s lost its reply; asking the gate again", what)
    seconds = {} if wait_out_outage else {"seconds": SUBMIT_RETRY_SECONDS}
    try:
        return outlast_restart(partial(call, retried=True), **seconds)[0]
    except redis.RedisError as exc:
        if wait_out_outage:
            raise
        raise GateUnavailable(
            f"{what}: the keyed queue's Redis went away during the submission, which may have "
            f"been queued and may still run: {exc}"
        ) from exc


def withdraw(task, key: str, ticket: int, *, forget: bool = False) -> None:
    """Withdraw the ticket of a submission that failed, and its record; what it frees is dispatched.

    ``forget``: no message of it was published, so its number can be given back."""
    withdrawn = current().gate.cancel(key, ticket, limit=task.serial_limit, forget=forget, failed=True)
    publish_grants(task.app, withdrawn.granted)


def _due_at(options: dict) -> datetime:
    eta = options.get("eta")
    if eta is not None:
        eta = datetime.fromisoformat(eta) if isinstance(eta, str) else eta
        return timezone.make_aware(eta) if timezone.is_naive(eta) else eta
    return timezone.now() + timedelta(seconds=float(options["countdown"]))
