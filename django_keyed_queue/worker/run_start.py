"""The gate's side of a run's start: the ticket its message names is started (or, for a delayed task now
due, one taken), or the message is dropped (``Ignore``) when it may not run now."""

from __future__ import annotations

import logging
import time
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

from celery.exceptions import Ignore

from ..gate import Code, Grant, Lease, Start, Submission, SubmitResult
from ..messaging import superseded
from ..messaging.building import delivered
from ..messaging.dispatch import publish, publish_grants
from ..messaging.message import DELAY_OPTIONS, ENQUEUED_HEADER, JOIN_HEADER, gate_message
from ..pools import pool_of
from ..process.outage import outlast_restart, take_ticket
from ..process.state import current, worker_gate
from ..records.statuses import Status
from ..records.transitions import Transition
from . import handoff

if TYPE_CHECKING:
    from celery.app.task import Context
    from kombu import Message

    from ..messaging.task_type import KeyedTaskProtocol


logger = logging.getLogger(__name__)


def join_or_start(
    task: KeyedTaskProtocol, header: dict[str, Any] | None, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Lease, int]:
    """The lease and attempt of the run of a message (``header``: its ticket's, None for a delayed task
    now due, which takes a ticket first); ``Ignore`` when it may not run now."""
    return _join(task, args, kwargs) if header is None else _start(task, header, args, kwargs)


def _start(
    task: KeyedTaskProtocol, header: dict[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Lease, int]:
    """Start the ticket the message's header names. Its arguments may make another key (``Run.check_key``):
    the gate starts only the ticket's own message (its task id), so a header copied onto another task's
    message is dropped, and a run whose own key function drifted fails holding its key."""
    request = task.request
    key, ticket = header["key"], int(header["ticket"])
    gate, dispatch = worker_gate(), int(header["dispatch"])
    kept = handoff.local().started(cast(str, request.id), key, ticket, dispatch)
    if kept is not None:  # the finish that kept it here started it
        return Lease(key, ticket, kept.token), kept.attempts
    start = Start(
        key, ticket, dispatch, max_lost=task.max_recoveries, block=task.blocks_on_failure,
        task_id=cast(str, request.id), interval_ms=task.serial_interval_ms, pool=pool_of(task),
    )  # fmt: skip
    started, _ = outlast_restart(lambda: gate.start(start))
    if started.granted:  # a slot its pool freed meanwhile went to them
        publish_grants(task.app, started.granted)
    if started.code is Code.TOO_EARLY:
        # The key's rate, or its pool's: another process started one of their tasks since this message was sent.
        send_when_due(task, Grant(key, ticket, dispatch, started.message or b""), started.wait_seconds)
        raise Ignore()
    if started.code is Code.PARKED:
        # Its pool has no slot: it waits, holding its key and no worker process, and is published again once
        # a slot is its.
        logger.info("%s[%s] key=%r ticket=%s waits for pool %r", task.name, request.id, key, ticket, task.serial_pool)
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
    # A granted ticket starts as any other, when its key's rate and its pool let it.
    checked = task.serial_interval_ms > 0 or task.serial_pool is not None
    key, submitted = join(task, request, args, kwargs, start=not checked, wait_out_outage=True)
    if checked and submitted is not None and submitted.granted:
        return _start(task, {"key": key, "ticket": submitted.ticket, "dispatch": 1}, args, kwargs)
    if submitted is None or not submitted.token:
        raise Ignore()  # a duplicate, or it waits for its key
    return Lease(key, submitted.ticket, submitted.token), 1


def send_when_due(task: KeyedTaskProtocol, grant: Grant, wait_seconds: float) -> None:
    """A granted ticket its key's rate does not let start yet: its message goes out again, for then.

    A worker holds it until then (Celery's ``eta``), in no child process; if that message is lost,
    the reaper publishes the ticket again once its dispatch deadline, moved past then, passes.
    """
    logger.info(
        "%s key=%r ticket=%s starts in %.3fs (rate=%s, pool=%s)",
        task.name,
        grant.key,
        grant.ticket,
        wait_seconds,
        task.serial_rate,
        task.serial_pool,
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
    join_id = cast(str, getattr(request, JOIN_HEADER, None) or request.id)  # sent before there was one: its id
    # Carried by the message its grant publishes: that run's record is the join's (see ``Run.begin``).
    options["headers"] = {**(options.get("headers") or {}), JOIN_HEADER: join_id}
    sent = None if received is None else delivered(received, {**received.headers, JOIN_HEADER: join_id})
    message = gate_message(task.name, cast(str, request.id), args, kwargs, options, sent)
    submission = Submission(
        key, message.encode(task.serializer, blocks=task.blocks_on_failure), cast(str, request.id),
        limit=task.serial_limit, coalesce=task.name if task.serial_coalesce else "", start=start, join_id=join_id,
        max_lost=task.max_recoveries, block=task.blocks_on_failure,
    )  # fmt: skip
    submitted = take_ticket(worker_gate(), task.name, submission, wait_out_outage=wait_out_outage)
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


def request_options(request: Context) -> dict[str, Any]:
    """The options a worker's ``request`` was sent with, as ``gate_message`` takes them (no delay: it is due)."""
    options = {k: v for k, v in request.as_execution_options().items() if k not in DELAY_OPTIONS}
    routing = request.delivery_info or {}
    if routing.get("routing_key"):
        options.setdefault("queue", routing["routing_key"])
    return options
