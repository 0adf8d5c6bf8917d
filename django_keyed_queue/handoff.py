"""Local handoff: a worker process runs the next task of the key it just finished.

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
import threading
import time
from dataclasses import dataclass
from functools import partial

from celery import states
from celery.app.trace import trace_task
from celery.utils.functional import maybe_list
from django.utils import timezone
from kombu.utils.encoding import safe_repr, safe_str

from . import records
from .conf import settings
from .dispatch import publish_grants
from .exceptions import MessageRefused
from .gate import Grant
from .messages import TaskMessage, ticket_header

logger = logging.getLogger(__name__)

#: Stored apply_async options a locally run task can honour; any other sends it through the broker.
HONOURED_OPTIONS = frozenset(
    {
        *("queue", "routing_key", "exchange", "exchange_type", "priority", "headers"),
        *("serializer", "compression", "delivery_mode", "retry", "retry_policy", "declare"),
        *("link", "link_error", "ignore_result", "root_id", "parent_id"),
    }
)


@dataclass(frozen=True)
class Kept:
    """A grant this process runs itself, once the run that freed the slot is traced."""

    grant: Grant
    request: dict
    #: The task id of the run that freed the slot: its ``task_postrun`` runs this one.
    after: str


#: Time limits this worker applies to every message (``--time-limit``, ``--soft-time-limit``),
#: noted in the worker's main process before its pool processes fork.
_worker_time_limits: tuple = ()
#: Whether this worker sends task events (``-E``): a task run here sends the ones its worker would.
_worker_sends_task_events = False


def note_worker(worker) -> None:
    """Called at ``worker_init`` with the worker: its time limits and task events apply here too."""
    global _worker_time_limits, _worker_sends_task_events
    _worker_time_limits = (worker.time_limit, worker.soft_time_limit)
    _worker_sends_task_events = bool(worker.task_events)


class _State(threading.local):
    running = False
    deadline = 0.0
    kept: Kept | None = None


_state = _State()


def keep(app, finished_request, grants: list[Grant]) -> list[Grant]:
    """Keep the first grant to run in this process if it may; returns the grants left to publish."""
    seconds = settings.LOCAL_HANDOFF_SECONDS
    if not grants or seconds <= 0 or _state.kept is not None:
        return grants
    if _state.running and time.monotonic() >= _state.deadline:
        return grants
    if any(finished_request.timelimit or ()):
        return grants  # the pool's timer of the message being run would cover the kept run too
    try:
        message = TaskMessage.decode(grants[0].message, app.conf.accept_content)
    except MessageRefused:
        return grants  # publishing refuses it too, and fails its task
    request = local_request(app, message, grants[0], finished_request.hostname)
    if request is None:
        return grants
    _state.kept = Kept(grants[0], request, after=finished_request.id)
    records.record_dispatched(message.task_id, timezone.now())
    return grants[1:]


def local_request(app, message: TaskMessage, grant: Grant, hostname: str) -> dict | None:
    """The request a broker message of ``grant`` would give the task here; None if it must go by broker."""
    task = app.tasks.get(message.task_name)
    options = message.options
    if task is None or not HONOURED_OPTIONS.issuperset(options):
        return None
    limits = (*_worker_time_limits, task.time_limit, task.soft_time_limit)
    limits += (app.conf.task_time_limit, app.conf.task_soft_time_limit)
    if any(limit is not None for limit in limits) or task.expires is not None:
        return None
    routed = app.amqp.router.route(dict(options), message.task_name, message.args, message.kwargs, task)
    queue = routed.get("queue")
    if queue is None or queue.name not in app.amqp.queues.consume_from:
        return None  # this worker does not read the queue the message would go to
    headers, properties, body, _ = app.amqp.create_task_message(
        message.task_id,
        message.task_name,
        message.args,
        message.kwargs,
        callbacks=maybe_list(options.get("link")),
        errbacks=maybe_list(options.get("link_error")),
        root_id=options.get("root_id"),
        parent_id=options.get("parent_id"),
        ignore_result=options.get("ignore_result"),
    )
    args, kwargs, embed = body
    return {
        **headers,
        **(options.get("headers") or {}),
        **ticket_header(grant.key, grant.ticket, grant.dispatch),
        "properties": properties,
        "reply_to": properties["reply_to"],
        "correlation_id": properties["correlation_id"],
        "hostname": hostname,
        "delivery_info": {
            "exchange": queue.exchange.name,
            "routing_key": routed.get("routing_key") or queue.routing_key,
            "priority": options.get("priority"),
            "redelivered": False,
        },
        "args": args,
        "kwargs": kwargs,
        "is_eager": False,
        **(embed or {}),
    }


def _trace(app, task, request: dict) -> None:
    """Run the task as the worker would, sending the task events the worker would send for it."""
    run = partial(trace_task, task, request["id"], request["args"], request["kwargs"], request)
    run = partial(run, hostname=request["hostname"], loader=app.loader, app=app)
    if not (_worker_sends_task_events and task.send_events):
        run()
        return
    with app.events.default_dispatcher(hostname=request["hostname"]) as dispatcher:
        send = partial(dispatcher.send, uuid=request["id"])
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


def run_kept(app, task_id: str) -> None:
    """After the run ``task_id`` is traced: run what it kept, and what those keep, within the budget.

    A kept run's own ``task_postrun`` calls this again, nested, and returns at
    once: the outermost call loops, so the stack does not grow with the chain.
    """
    kept = _state.kept
    if kept is None or kept.after != task_id or _state.running:
        return
    _state.running = True
    _state.deadline = time.monotonic() + settings.LOCAL_HANDOFF_SECONDS
    try:
        while _state.kept is not None:
            kept, _state.kept = _state.kept, None
            logger.debug("running key=%r ticket=%s here (local handoff)", kept.grant.key, kept.grant.ticket)
            _trace(app, app.tasks[kept.request["task"]], kept.request)
    finally:
        _state.running = False
        left, _state.kept = _state.kept, None
        if left is not None:  # the loop was interrupted: the grant goes out as usual
            publish_grants(app, [left.grant])
