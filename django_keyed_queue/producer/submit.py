"""The producer's submission of one task: checked, its idempotency claimed, and Celery sends the message
to the gate, which takes a ticket, keeps the record for the row (``records.submissions`` writes it)
and, if granted, the producer publishes it at once. On commit: the same, when the transaction commits.

Nothing is left behind when a step fails: no ticket, no row, no message, no claim.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

import redis
from celery.result import AsyncResult
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.utils import timezone

from ..conf import settings
from ..exceptions import GateUnavailable, InvalidArguments, KeyQueueFull
from ..gate import Cancel, QueueFull, Submission
from ..messaging import superseded
from ..messaging.building import SendNow, send_to_gate
from ..messaging.dispatch import publish_grants
from ..messaging.message import TaskMessage, gate_message, is_delayed, ticket_header, with_debounce
from ..process.outage import take_ticket
from ..process.state import current, producer_gate
from ..records import idempotency, submissions
from ..records.models import KeyedTask
from ..records.statuses import Status
from ..records.transitions import describe_arguments
from .checks import Checked, check

if TYPE_CHECKING:
    from ..messaging.task_type import KeyedTaskProtocol

logger = logging.getLogger(__name__)


def submit(
    task: KeyedTaskProtocol,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    options: dict[str, Any],
    idempotency_key: str | None,
    *,
    claimed: bool = False,
) -> AsyncResult[Any]:
    """``task.apply_async(args, kwargs, **options)`` through the key's queue; the task's AsyncResult.

    ``claimed``: the idempotency key was claimed for this task id already (``submit_on_commit``).
    """
    checked = check(task, args, kwargs, options, idempotency_key)
    fingerprint, task_id, key = checked.fingerprint, checked.task_id, checked.key
    if not claimed and (original := duplicate_of(task, checked)) is not None:
        return task.AsyncResult(original)
    args, kwargs, options = checked.args, checked.kwargs, checked.options
    try:
        if is_delayed(options):
            return _delay(task, key, task_id, args, kwargs, options)
        return _enqueue(task, key, task_id, args, kwargs, options)
    except BaseException:
        if fingerprint is not None:
            idempotency.unclaim(fingerprint, task_id)
        raise


def duplicate_of(task: KeyedTaskProtocol, checked: Checked) -> str | None:
    """Claim ``checked``'s idempotency key; None if it claimed it (or has none), else the id of the task a
    duplicate returns: the original, or the task that replaced it (``idempotency.resolve``)."""
    if checked.fingerprint is None:
        return None
    original = idempotency.claim(checked.fingerprint, task.name, checked.task_id, **checked.claimed_with)
    if original is None:
        return None
    runs = idempotency.resolve(producer_gate(), original, checked.key)
    logger.debug("duplicate of %s[%s] key=%r: returning %s", task.name, original, checked.key, runs)
    return runs


def in_transaction(using: str | None = None) -> bool:
    """The caller is inside ``transaction.atomic()`` on database ``using`` (the default database)."""
    return connections[using or DEFAULT_DB_ALIAS].in_atomic_block


def submit_on_commit(
    task: KeyedTaskProtocol,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    options: dict[str, Any],
    idempotency_key: str | None,
) -> AsyncResult[Any]:
    """``task.apply_async(...)`` once the caller's transaction commits (at once outside one): the ticket
    is taken then, so tasks of one key run in commit order, and a rollback leaves nothing.

    Bad input raises now, inside the transaction. An idempotency key is claimed
    now when the records live in the transaction's database, so that the claim
    commits or rolls back with it and a duplicate returns the original at once;
    else it is claimed at commit. Returns the AsyncResult the task will have.
    """
    if not in_transaction():
        return task.apply_async(args, kwargs, idempotency_key=idempotency_key, **options)
    checked = check(task, args, kwargs, options, idempotency_key)
    gate_message(task.name, checked.task_id, checked.args, checked.kwargs, checked.options).encode(task.serializer)
    options = {**options, "task_id": checked.task_id}
    if task.app.conf.task_always_eager:  # Celery's eager run, at commit
        transaction.on_commit(partial(task.apply_async, args, kwargs, **options))
        return task.AsyncResult(checked.task_id)
    claimed = False
    if checked.fingerprint is not None and idempotency.database() == DEFAULT_DB_ALIAS:
        if (original := duplicate_of(task, checked)) is not None:
            return task.AsyncResult(original)
        claimed = True
    logger.debug("%s[%s] key=%r is submitted when the transaction commits", task.name, checked.task_id, checked.key)
    transaction.on_commit(partial(submit, task, args, kwargs, options, idempotency_key, claimed=claimed))
    return task.AsyncResult(checked.task_id)


def _delay(
    task: KeyedTaskProtocol,
    key: str,
    task_id: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    options: dict[str, Any],
) -> AsyncResult[Any]:
    """A delayed task joins its key's queue when due, on the worker (see ``request.KeyedRequest``)."""
    message = gate_message(task.name, task_id, args, kwargs, options)
    with transaction.atomic(using=KeyedTask.objects.db_for_write()):
        row = submission_row(task, key, message, options)
        KeyedTask.objects.insert_submission(status=Status.WAITING, due_at=_due_at(options), **row)
        result = task.send_plain(args, kwargs, task_id=task_id, **options)
    current().totals.count("submitted", task)
    return result


def _enqueue(
    task: KeyedTaskProtocol,
    key: str,
    task_id: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    options: dict[str, Any],
) -> AsyncResult[Any]:
    """Celery builds and sends the message; to the gate, which takes its ticket, keeps its record and,
    if granted, it is published at once: nothing left behind on failure."""

    def take_and_publish(message: TaskMessage, send_now: SendNow) -> None:
        sub = gate_submission(task, key, message, options)
        try:
            gate = producer_gate()  # a Redis Cluster's client connects as it is made
            submitted = take_ticket(gate, task.name, replace(sub, wire=send_now.wire(key, gate.client)))
        except QueueFull as full:
            raise queue_full(task, full, sub, "; nothing was submitted") from full
        except redis.RedisError as exc:
            raise GateUnavailable(f"{task.name}: the keyed queue's Redis is unreachable: {exc}") from exc
        assert submitted is not None  # only joins can be duplicates
        if submitted.superseded is not None:
            superseded.replaced(task, key, submitted.superseded[1], by=task_id)
        if not submitted.granted or submitted.pushed:
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

    sent = send_to_gate(task.app, task, task_id, args, kwargs, with_debounce(task, options), take_and_publish)
    current().totals.count("submitted", task)
    return sent


def gate_submission(task: KeyedTaskProtocol, key: str, message: TaskMessage, options: dict[str, Any]) -> Submission:
    """What the gate takes for a submission of ``task``: its stored message, its record, its key's limits."""
    row = submission_row(task, key, message, options)
    return Submission(
        key, row["message"].encode(), message.task_id,
        record=submissions.encode_record(message.task_id, task.name, row["arguments"]),
        limit=task.serial_limit, max_waiting=waiting_limit(task), coalesce=task.name if task.serial_coalesce else "",
        debounce_ms=task.serial_debounce_ms,
    )  # fmt: skip


def queue_full(task: KeyedTaskProtocol, full: QueueFull, submission: Submission, then: str = "") -> KeyQueueFull:
    return KeyQueueFull(
        f"{task.name}: key {submission.key!r} has {full.waiting} tasks waiting, the most it may have "
        f"(max_waiting={submission.max_waiting}){then}"
    )


def submission_row(task: KeyedTaskProtocol, key: str, message: TaskMessage, options: dict[str, Any]) -> dict[str, Any]:
    """The fields of the submission's database row, its stored message encoded (refused if too large)."""
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


def waiting_limit(task: KeyedTaskProtocol) -> int:
    """Most tickets that may wait behind the task's key (0: no limit)."""
    limit = task.max_waiting if task.max_waiting is not None else settings.MAX_WAITING
    return limit or 0


def withdraw(task: KeyedTaskProtocol, key: str, ticket: int, *, forget: bool = False) -> None:
    """Withdraw the ticket of a submission that failed, and its record; what it frees is dispatched.

    ``forget``: no message of it was published, so its number can be given back."""
    withdrawn = producer_gate().cancel(Cancel(key, ticket, limit=task.serial_limit, forget=forget, failed=True))
    publish_grants(task.app, withdrawn.granted)


def _due_at(options: dict[str, Any]) -> datetime:
    eta = options.get("eta")
    if eta is not None:
        eta = datetime.fromisoformat(eta) if isinstance(eta, str) else eta
        return timezone.make_aware(eta) if timezone.is_naive(eta) else eta
    return timezone.now() + timedelta(seconds=float(options["countdown"]))
