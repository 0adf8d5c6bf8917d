"""Local handoff: a worker process runs the next task of the key it just finished.

The dispatcher decides to keep a grant and when to run it (``dispatch.hand_over``,
``dispatch.run_kept``); this module builds the request and runs the task as the
worker would.

When a run finishes and the gate grants the key's next ticket, publishing that
ticket's message costs a broker round trip, a wake-up of a worker's main
process and of a pool process, and the next run waits for all of it. Instead,
the process that finished keeps the grant and, once Celery has stored the
finished task's result (``task_postrun``), runs it through Celery's own tracer
(result backend, signals, retries, callbacks) with the request the broker
message would have carried. The gate still decides: the kept run starts
through the same ``start`` call as any message, so exclusion, order and
fencing are unchanged.

A process keeps handing off locally for at most
``KEYED_QUEUE_LOCAL_HANDOFF_SECONDS``, then publishes the next grant through
the broker, so one busy key cannot hold a pool process for long. Only a task
that a broker message would have brought to this worker is run here, and only
when nothing needs the worker's own machinery: no time limit (the pool
enforces it per message), no expiry, no canvas options beyond links.
Everything else is published as usual.
"""

from __future__ import annotations

import logging
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial

import celery
from celery import signals, states
from celery.app.task import Context
from celery.app.trace import LOG_RECEIVED, trace_task
from celery.utils.imports import symbol_by_name
from kombu import Message
from kombu.utils.encoding import safe_repr, safe_str

from ..gate import Grant
from .messages import TaskMessage, ticket_header
from .process import WorkerTraits
from .sending import built

#: Stored apply_async options a locally run task can honour; any other sends it through the broker.
HONOURED_OPTIONS = frozenset(
    {
        *("queue", "routing_key", "exchange", "exchange_type", "priority", "headers"),
        *("serializer", "compression", "delivery_mode", "retry", "retry_policy", "declare"),
        *("link", "link_error", "ignore_result", "root_id", "parent_id"),
    }
)


#: The logger of Celery's worker that logs each message it receives.
received_log = logging.getLogger("celery.worker.strategy")

#: Celery 5.7's worker fails the task of a message rejected without requeue (before, it stayed PENDING).
REJECT_FAILS_THE_TASK = celery.VERSION >= (5, 7)


@dataclass(frozen=True)
class Kept:
    """A grant this process runs itself, once the run that freed the slot is traced."""

    grant: Grant
    request: dict
    #: The task id of the run that freed the slot: its ``task_postrun`` runs this one.
    after: str


def local_request(app, message: TaskMessage, grant: Grant, hostname: str, worker: WorkerTraits) -> dict | None:
    """The request a broker message of ``grant`` would give the task here; None if it must go by broker."""
    task = app.tasks.get(message.task_name)
    options = message.options
    if task is None or not HONOURED_OPTIONS.issuperset(options):
        return None
    limits: tuple[float | None, ...] = (*worker.time_limits, task.time_limit, task.soft_time_limit)
    limits += (app.conf.task_time_limit, app.conf.task_soft_time_limit)
    if any(limit is not None for limit in limits) or task.expires is not None:
        return None
    if getattr(task, "serial_interval_ms", 0):
        return None  # its key's rate: it may start only later, which a broker message waits out
    sent = built(app, message).sent
    assert sent is not None
    if not set(sent["declare"]) & set(app.amqp.queues.consume_from):
        return None  # this worker does not read the queue the message would go to
    headers = {**sent["headers"], **ticket_header(grant.key, grant.ticket, grant.dispatch)}
    if headers.get("eta") is not None or headers.get("expires") is not None:
        return None
    properties = sent["properties"]
    return {
        **headers,
        "properties": properties,
        "reply_to": properties.get("reply_to"),
        "correlation_id": properties.get("correlation_id"),
        "hostname": hostname,
        "delivery_info": {
            "exchange": sent["exchange"],
            "routing_key": sent["routing_key"],
            "priority": properties.get("priority"),
            "redelivered": False,
        },
        "args": list(message.args),
        "kwargs": message.kwargs,
        "is_eager": False,
        **sent["embed"],
    }


def trace(app, task, request: dict, worker: WorkerTraits) -> None:
    """Run the task as the worker would, sending the task events the worker would send for it."""
    run = partial(trace_task, task, request["id"], request["args"], request["kwargs"], request)
    run = partial(run, hostname=request["hostname"], loader=app.loader, app=app)
    _receive(app, task, request)
    events = worker.sends_task_events and task.send_events
    with app.events.default_dispatcher(hostname=request["hostname"]) if events else nullcontext() as dispatcher:
        send = partial(dispatcher.send, uuid=request["id"]) if dispatcher else _no_event
        send(
            "task-received",
            name=task.name,
            args=request["argsrepr"],
            kwargs=request["kwargsrepr"],
            root_id=request["root_id"],
            parent_id=request["parent_id"],
            retries=request["retries"],
            eta=None,
            expires=None,
        )
        send("task-started")
        retval, info, runtime, result = run()
        if info is None:
            send("task-succeeded", result=result, runtime=runtime)
        elif info.state == states.FAILURE:
            send("task-failed", exception=safe_repr(retval.exception), traceback=safe_str(retval.traceback))
        elif info.state == states.RETRY:
            send("task-retried", exception=safe_repr(retval.exception.exc), traceback=safe_str(retval.traceback))
        elif info.state == states.REJECTED:
            _rejected(task, request, info.retval, retval, send)


def _receive(app, task, request: dict) -> None:
    """What a worker's main process does first with a message it received: the log line, ``task_received``.

    The signal's request is the worker's own request class, made from the message the
    request stands for; its sender is None, as no consumer received it.
    """
    context = {
        "id": request["id"],
        "name": task.name,
        "args": request["argsrepr"],
        "kwargs": request["kwargsrepr"],
        "eta": None,
    }
    received_log.info(LOG_RECEIVED, context, extra={"data": context})
    if not signals.task_received.receivers:
        return
    message = Message(delivery_info=request["delivery_info"], properties=request["properties"], headers=request)
    embed = {name: request.get(name) for name in ("callbacks", "errbacks", "chain", "chord")}
    body = (request["args"], request["kwargs"], embed)
    received = symbol_by_name(task.Request)(
        message, app=app, hostname=request["hostname"], task=task, body=body, headers=request, decoded=True
    )
    signals.task_received.send(sender=None, request=received)


def _rejected(task, request: dict, exc, einfo, send) -> None:
    """What the worker's main process does for a rejected message, which a local run does not have."""
    if not exc.requeue and REJECT_FAILS_THE_TASK:
        # Celery 5.7+: a message rejected for good never runs again; its task failed.
        store = not request.get("ignore_result") or task.store_errors_even_if_ignored
        task.backend.mark_as_failure(request["id"], exc, request=Context(request), store_result=store)
        signals.task_failure.send(
            sender=task,
            task_id=request["id"],
            exception=exc,
            args=request["args"],
            kwargs=request["kwargs"],
            traceback=einfo.traceback,
            einfo=einfo,
        )
        send("task-failed", exception=safe_repr(exc), traceback=safe_str(einfo.traceback))
    if task.acks_late:  # an early-acknowledged message cannot be rejected: no event
        send("task-rejected", requeue=exc.requeue)


def _no_event(*args, **kwargs) -> None:
    pass
