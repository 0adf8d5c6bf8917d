"""A bulk submission (``apply_async_many``): every call checked and built first, then one gate round trip
per batch for their tickets; what a failed step had not published is withdrawn."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Any

from celery.result import AsyncResult

from ..conf import settings
from ..exceptions import GateUnavailable, InvalidArguments
from ..gate import NotSent, QueueFull, Submission, SubmitResult
from ..messaging import superseded
from ..messaging.building import build, gate_wire, publish_stored
from ..messaging.message import TaskMessage, is_delayed, ticket_header, with_debounce
from ..process.outage import asked_again
from ..process.state import current, producer_gate
from ..records import idempotency
from .checks import Checked, check
from .submit import duplicate_of, gate_submission, in_transaction, queue_full, submit, withdraw

if TYPE_CHECKING:
    from kombu import Producer

    from ..messaging.task_type import KeyedTaskProtocol


def submit_many(
    task: KeyedTaskProtocol,
    calls: Iterable[object],
    options: dict[str, Any],
    idempotency_keys: Iterable[str | None] | None,
    batch_size: int,
) -> list[AsyncResult[Any]]:
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
    checked = [check(task, *call, options, key) for call, key in zip(arguments, keys, strict=True)]
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
    results: list[AsyncResult[Any]] = []
    with task.app.producer_or_acquire(options.get("producer")) as producer:
        prepared = [_prepared(task, c) for c in checked]
        for start in range(0, len(prepared), batch_size):
            results += _submit_batch(task, prepared[start : start + batch_size], producer, submitted=len(results))
    return results


def _call_arguments(task: KeyedTaskProtocol, call: object) -> tuple[tuple[Any, ...], dict[str, Any]]:
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
    result: AsyncResult[Any]
    claimed: bool = False


def _prepared(task: KeyedTaskProtocol, checked: Checked) -> _Prepared:
    """A checked call with the message Celery builds for it (the publish signals fire now), stored form checked."""
    options = with_debounce(task, checked.options)
    message, result = build(task.app, task, checked.task_id, checked.args, checked.kwargs, options)
    return _Prepared(checked, message, gate_submission(task, checked.key, message, checked.options), result)


def _submit_batch(
    task: KeyedTaskProtocol, batch: list[_Prepared], producer: Producer, *, submitted: int
) -> list[AsyncResult[Any]]:
    """Claim idempotency keys, take the batch's tickets in one round trip, publish the granted; the results.

    If a step fails, what it had not yet published is withdrawn, and the error
    says how many of the calls (``submitted`` before this batch) went in.
    """
    results, sending = [], []
    for item in batch:
        c = item.checked
        original = duplicate_of(task, c)
        if original is not None:
            results.append(task.AsyncResult(original))
            continue
        item.claimed = c.fingerprint is not None
        results.append(item.result)
        sending.append(item)
    try:
        outcomes = _take_tickets(task, sending, producer)
    except BaseException:
        _unclaim(sending)
        raise
    for item, outcome in zip(sending, outcomes, strict=True):
        if not isinstance(outcome, QueueFull) and outcome.superseded is not None:
            superseded.replaced(task, item.submission.key, outcome.superseded[1], by=item.checked.task_id)
    for i, (item, outcome) in enumerate(zip(sending, outcomes, strict=True)):
        key = item.submission.key
        try:
            if isinstance(outcome, QueueFull):
                raise queue_full(task, outcome, item.submission)
            if outcome.granted and not outcome.pushed:
                publish_stored(task.app, item.message, ticket_header(key, outcome.ticket, 1), producer)
        except BaseException as exc:
            later = list(zip(sending[i:], outcomes[i:], strict=True))
            # The last first: none is granted in another's place, and unseen tickets give their numbers back.
            for unsent, taken in reversed(later):
                if not isinstance(taken, QueueFull):
                    withdraw(task, unsent.submission.key, taken.ticket, forget=unsent is not item)
            _unclaim([unsent for unsent, _ in later])
            went_in = submitted + results.index(item.result)
            exc.add_note(f"the first {went_in} calls of the bulk submission were submitted, the rest were not")
            raise
    if sending:
        current().totals.count("submitted", task, n=len(sending))
    return results


def _take_tickets(
    task: KeyedTaskProtocol, sending: list[_Prepared], producer: Producer
) -> list[SubmitResult | QueueFull]:
    """``Gate.submit_many`` of ``sending``, each with the broker message the gate pushes when it grants
    it (``messaging/wire.py``), asked again when a lost reply may hide tickets taken."""
    try:
        gate = producer_gate()  # a Redis Cluster's client connects as it is made
        batch = [
            replace(item.submission, wire=gate_wire(task.app, item.message, item.submission.key, producer, gate.client))
            for item in sending
        ]
        return asked_again(partial(gate.submit_many, batch), f"{task.name}: a bulk submission of {len(batch)} calls")
    except NotSent as exc:
        raise GateUnavailable(f"{task.name}: the keyed queue's Redis is unreachable: {exc}") from exc


def _unclaim(items: list[_Prepared]) -> None:
    for item in items:
        if item.claimed and item.checked.fingerprint is not None:
            idempotency.unclaim(item.checked.fingerprint, item.checked.task_id)
