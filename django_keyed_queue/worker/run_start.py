"""A run's start: the ticket its message names is started (or, for a delayed task now due, one taken),
its record moved to running, its lease held."""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Self, cast

from celery.exceptions import Ignore
from django.utils import timezone

from ..conf import settings
from ..gate import Code, Grant, Lease, SubmitResult
from ..messaging import superseded
from ..messaging.building import delivered
from ..messaging.dispatch import publish, publish_grants
from ..messaging.message import ENQUEUED_HEADER, HEADER, JOIN_HEADER, gate_message
from ..pools import pool_of
from ..process.outage import outlast_restart, take_ticket
from ..process.state import current
from ..records.statuses import Status
from ..records.transitions import Transition
from . import handoff
from .run_base import RunBase, request_options

if TYPE_CHECKING:
    from celery.app.task import Context
    from kombu import Message

    from ..messaging.task_type import KeyedTaskProtocol


logger = logging.getLogger(__name__)


class RunStart(RunBase):
    @classmethod
    def begin(cls, task: KeyedTaskProtocol, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Self:
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
        process.leases.hold(lease, cast(str, request.id), attempts, task.serial_pool)
        process.totals.count("started", task)
        waited = waited_for_key(request) if attempts == 1 else None
        if waited is not None:
            process.totals.observe("wait_seconds", task, waited)
        return cls(task, lease, attempts)


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
    pool = pool_of(task)
    started, _ = outlast_restart(
        lambda: gate.start(
            key,
            ticket,
            dispatch,
            max_lost=task.max_recoveries,
            block=task.blocks_on_failure,
            task_id=cast(str, request.id),
            interval_ms=task.serial_interval_ms,
            pool=pool,
        )  # fmt: skip
    )
    if started.granted:  # a slot its pool freed meanwhile went to them
        publish_grants(task.app, started.granted)
    if started.code is Code.TOO_EARLY:
        # The key's rate, or its pool's: another process started one of their tasks since this message was sent.
        send_when_due(task, Grant(key, ticket, dispatch, started.message or b""), started.wait_seconds)
        raise Ignore()
    if started.code is Code.PARKED:
        # Its pool has no slot: it waits, holding its key and no worker process, and is published again once
        # a slot is its.
        assert pool is not None
        logger.info("%s[%s] key=%r ticket=%s waits for pool %r", task.name, request.id, key, ticket, pool.name)
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

    A worker holds it until then (Celery's ``eta``), in no pool process; if that message is lost,
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
