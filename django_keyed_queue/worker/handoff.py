"""Local handoff: a worker process runs the next task of the key it just finished.

``LocalHandoff`` owns it: its state (the grant kept, the chain running now, its
deadline) and its decisions (keep a grant or publish it, run what was kept,
publish a kept run that rejects itself with requeue). ``local()`` is this
process's; the worker's wiring calls it from ``task_postrun`` (``ops.signals``),
and ``handoff_runs`` tells the worker's main process which task each pool
process runs this way.

When a run finishes and the gate grants the key's next ticket, publishing that
ticket's message costs a broker round trip, a wake-up of a worker's main
process and of a child process, and the next run waits for all of it. Instead,
the process that finished keeps the grant and, once Celery has stored the
finished task's result (``task_postrun``), runs it through Celery's own tracer
(result backend, signals, retries, callbacks) with the request the broker
message would have carried, in a ``contextvars`` context of its own: its
trace context is its message's (a ``traceparent`` header), or none, never
that of the task it runs after. The gate still decides: the kept run starts
through the same ``start`` call as any message, so exclusion, order and
fencing are unchanged.

A process keeps handing off locally for at most
``KEYED_QUEUE_LOCAL_HANDOFF_SECONDS``, then publishes the next grant through
the broker, so one busy key cannot hold a child process for long. Only a task
that a broker message would have brought to this worker is run here, and only
when nothing needs the worker's own machinery: no time limit (the pool
enforces it per message), no expiry, no canvas options beyond links.
Everything else is published as usual.
"""

from __future__ import annotations

import contextvars
import logging
import os
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass, replace
from functools import partial
from traceback import format_exception
from typing import TYPE_CHECKING, Any, cast

import celery
import redis
from celery import Celery, Task, signals, states
from celery.app.task import Context
from celery.app.trace import LOG_RECEIVED, trace_task
from celery.utils.imports import symbol_by_name
from celery.utils.saferepr import saferepr
from django.utils import timezone
from kombu import Message
from kombu.utils.encoding import safe_repr, safe_str

from ..conf import settings
from ..exceptions import MessageRefused
from ..gate import Grant, KeptStart, Lease
from ..gate.views import WorkerGate
from ..messaging.building import with_celery_message
from ..messaging.dispatch import Dispatched, publish, publish_grants, record_dispatched
from ..messaging.message import TaskMessage, ticket_header
from ..process.state import WorkerTraits, current, worker_gate
from . import handoff_runs

if TYPE_CHECKING:
    from collections.abc import Callable

    from billiard.einfo import ExceptionInfo
    from celery.exceptions import Reject

    from ..messaging.task_type import KeyedTaskProtocol

logger = logging.getLogger(__name__)

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
    request: dict[str, Any]
    #: The task id of the run that freed the slot: its ``task_postrun`` runs this one.
    after: str
    #: Seconds that run took, to its finish: its ``task-succeeded`` event says it, sent from here.
    after_runtime: float = 0.0


class LocalHandoff(threading.local):
    """This process's local handoff, per thread: the one owner of its state and its decisions."""

    def __init__(self) -> None:
        #: The grant kept to run here once the run that freed it is traced.
        self.kept: Kept | None = None
        #: A chain of kept runs is running; it hands off locally until ``deadline`` (monotonic).
        self.running = False
        self.deadline = 0.0
        #: The kept grant running now: it came by no broker message.
        self.tracing: Kept | None = None
        #: The task whose job the chain runs in (its host), while ``running``.
        self.host = ""

    def may_keep(self, finished_request: Context) -> bool:
        """Whether this process may keep the grant a run's finish frees, whatever that grant is: asked
        before the finish, so that the gate pushes no message for a grant kept here."""
        if settings.LOCAL_HANDOFF_SECONDS <= 0 or self.kept is not None:
            return False
        if self.running and time.monotonic() >= self.deadline:
            return False
        # The pool's timer of the message being run would cover the kept run too.
        return not any(finished_request.timelimit or ())

    def keeping(self, task: KeyedTaskProtocol, gate: WorkerGate) -> tuple[float, KeptStart | None]:
        """What the finish of ``task``'s run now asks for this process's local handoff: how long the first
        grant it frees is kept here (0: not kept, ``Finish.keep_first_seconds``), and whether the finish
        starts it too (``Finish.start_kept``).

        A grant kept here has a lease's time to start; if this process dies first, the reaper publishes it.
        One of this task the finish starts itself (no start call): a kill before it runs is then a lost run,
        recovered as one. Not for a paced or debounced key (its rate or eta decides when), nor a task never
        recovered. (A pooled one's where the finish cannot ask its pool, a Redis Cluster: the gate's finish
        starts none, ``Gate.finish``.)"""
        if not self.may_keep(task.request):
            return 0.0, None
        starts = not task.serial_interval_ms and not task.serial_debounce_ms and task.max_recoveries > 0
        start_kept = KeptStart(task.name, task.max_recoveries, task.blocks_on_failure) if starts else None
        return gate.lease_ms / 1000, start_kept

    def hand_over(
        self, app: Celery, finished_request: Context, grants: list[Grant], *, runtime: float = 0.0
    ) -> Dispatched:
        """Dispatch what a run's finish granted: the first grant may be kept to run here, next (``runtime``:
        the finished run's, so far)."""
        return _publish(app, self._keep(app, finished_request, grants, runtime))

    def _keep(self, app: Celery, finished_request: Context, grants: list[Grant], runtime: float) -> list[Grant]:
        """Keep the first grant to run in this process if it may; returns the grants left to publish."""
        if not grants or grants[0].pushed or not self.may_keep(finished_request):
            return grants  # pushed: the gate sent its message already
        try:
            message = TaskMessage.decode(grants[0].message, current().worker.accepted(app))
        except MessageRefused:
            return grants  # publishing refuses it too, and fails its task
        request = local_request(app, message, grants[0], finished_request.hostname, current().worker)
        if request is None:
            return grants
        # A run's request always has its task's id (celery-types' Context allows None).
        self.kept = Kept(grants[0], request, after=cast(str, finished_request.id), after_runtime=runtime)
        # Told to the worker's main process now: a revoke of the task that ended leaves this run alone.
        handoff_runs.note(self.host if self.running else self.kept.after, request)
        record_dispatched(grants[0], message.task_id, timezone.now())
        return grants[1:]

    def run_kept(self, app: Celery, task_id: str, retval: Any = None, state: str | None = None) -> None:
        """After the run ``task_id`` is traced (``retval``, ``state``: its result): run what it kept, and what
        those keep, within the budget.

        A kept run's own ``task_postrun`` calls this again, nested, and returns at
        once: the outermost call loops, so the stack does not grow with the chain.
        The job's own task succeeded before the chain: its ``task-succeeded`` goes out
        now, not when the job ends after the chain (its worker's main process sends
        none then).
        """
        kept = self.kept
        if kept is None or kept.after != task_id or self.running:
            return
        self.running, self.host = True, task_id
        self.deadline = time.monotonic() + settings.LOCAL_HANDOFF_SECONDS
        announced = False
        try:
            try:
                announced = _announce_end(app, kept, retval, state)
            except Exception:  # an event is worth less than the run: its worker sends it when the job ends
                logger.warning("task %s: its end's event is left to its job's end", task_id, exc_info=True)
            while self.kept is not None:
                kept, self.kept = self.kept, None
                if handoff_runs.revoked(kept.request["id"]):
                    _drop_revoked(app, kept)
                    continue
                logger.debug("running key=%r ticket=%s here (local handoff)", kept.grant.key, kept.grant.ticket)
                self.tracing = kept
                handoff_runs.note(task_id, kept.request, started=time.time())  # this job's own task finished
                task = app.tasks[kept.request["task"]]
                current().totals.count("handed_over", task.name)
                handoff_runs.count_run(task.name)
                # In a context of its own, as a message's run starts: what the task it runs after left
                # current (a tracer's span, attached by that task's task_prerun and detached only by its
                # task_postrun, after this) must not become this run's parent.
                contextvars.Context().run(trace, app, task, kept.request, current().worker)
                self.tracing = None
        finally:
            handoff_runs.clear(task_id, announced=announced)
            self.running, self.tracing = False, None
            left, self.kept = self.kept, None
            if left is not None:  # the loop was interrupted: the grant goes out as usual
                _publish(app, [left.grant])

    def started(self, task_id: str, key: str, ticket: int, dispatch: int) -> Grant | None:
        """The kept grant running now, if the finish that kept it started it for this run (once)."""
        tracing = self.tracing
        if tracing is None or not tracing.grant.token or tracing.request["id"] != task_id:
            return None
        grant = tracing.grant
        if (grant.key, grant.ticket, grant.dispatch) != (key, ticket, dispatch):
            return None
        self.tracing = replace(tracing, grant=replace(grant, token=0))  # a second start goes to the gate
        return grant

    def requeue_kept(self, app: Celery, task_id: str, key: str, ticket: int) -> None:
        """``Reject(requeue=True)`` of a run: if it runs here by local handoff, there is no message for
        the broker to deliver again, so its grant's message is published now, as that delivery."""
        tracing = self.tracing
        if tracing is None:
            return
        if (tracing.request["id"], tracing.grant.key, tracing.grant.ticket) == (task_id, key, ticket):
            publish(app, tracing.grant, mark_dispatched=False)


_local = LocalHandoff()


def local() -> LocalHandoff:
    """This process's local handoff (a forked child process starts with none kept)."""
    return _local


def _after_fork_in_child() -> None:
    global _local
    _local = LocalHandoff()
    handoff_runs.forget_counted()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _publish(app: Celery, grants: list[Grant]) -> Dispatched:
    """Publish grants this process does not run itself."""
    return publish_grants(app, [g for g in map(_not_kept, grants) if g is not None])


def _announce_end(app: Celery, kept: Kept, retval: Any, state: str | None) -> bool:
    """Send ``task-succeeded`` or ``task-failed`` for the task that kept ``kept`` (its ``retval`` and
    ``state`` as ``task_postrun`` has them), as its worker would have when its job ended, if the worker
    sends task events; whether it was sent."""
    if state == states.SUCCESS:
        event = "task-succeeded"
    elif state == states.FAILURE and isinstance(retval, BaseException):
        event = "task-failed"
    else:
        return False
    task = app.tasks.get(kept.request["task"])
    if not (handoff_runs.task_events(current().worker.sends_task_events) and getattr(task, "send_events", True)):
        return False
    if event == "task-succeeded":
        result = saferepr(retval, getattr(task, "resultrepr_maxsize", 1024))  # as Celery's tracer reprs it
        fields = {"result": result, "runtime": kept.after_runtime}
    else:  # as the worker's Request.on_failure words it
        fields = {"exception": safe_repr(retval), "traceback": "".join(format_exception(retval))}
    with app.events.default_dispatcher(hostname=kept.request["hostname"]) as dispatcher:
        dispatcher.send(event, uuid=kept.after, **fields)
    return True


def _drop_revoked(app: Celery, kept: Kept) -> None:
    """A kept grant whose task Celery revoked at this worker: not run, as Celery drops a revoked message.
    Its grant is given back unstarted and ``task_revoked`` is sent, whose receiver withdraws it from its
    key (``ops.signals``), which moves on."""
    request = kept.request
    logger.info("%s[%s] was revoked: its kept grant is not run (local handoff)", request["task"], request["id"])
    _not_kept(kept.grant)  # given back as granted, its attempt not counted
    task = app.tasks[request["task"]]
    context = Context(request)
    store = not request.get("ignore_result") or task.store_errors_even_if_ignored
    task.backend.mark_as_revoked(request["id"], "revoked", request=context, store_result=store)
    signals.task_revoked.send(sender=task, request=context, terminated=False, signum=None, expired=False)


def _not_kept(grant: Grant) -> Grant | None:
    """A grant to publish. One the finish started for this process, which will not run it after all,
    is first given back as granted, its attempt not counted; None if it is no longer this process's
    (fenced), or Redis is out of reach (its lease then expires, and the reaper dispatches it again)."""
    if not grant.token:
        return grant
    try:
        given_back = worker_gate().requeue(Lease(grant.key, grant.ticket, grant.token), unstarted=True)
    except redis.RedisError:
        logger.warning("keyed queue key=%r ticket=%s: its kept grant is left to the reaper", grant.key, grant.ticket)
        return None
    return replace(grant, token=0, attempts=0) if given_back else None


def local_request(
    app: Celery, message: TaskMessage, grant: Grant, hostname: str | None, worker: WorkerTraits
) -> dict[str, Any] | None:
    """The request a broker message of ``grant`` would give the task here; None if it must go by broker."""
    task = app.tasks.get(message.task_name)
    options = message.options
    if task is None or not HONOURED_OPTIONS.issuperset(options):
        return None
    limits: tuple[float | None, ...] = (*worker.time_limits, task.time_limit, task.soft_time_limit)
    if not worker.in_worker:  # the app's own limits, as they are now (a worker's include them)
        limits += (app.conf.task_time_limit, app.conf.task_soft_time_limit)
    if any(limit is not None for limit in limits) or task.expires is not None:
        return None
    if getattr(task, "serial_interval_ms", 0):
        return None  # its key's rate: it may start only later, which a broker message waits out
    sent = with_celery_message(app, message).sent
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


def trace(app: Celery, task: Task[..., Any], request: dict[str, Any], worker: WorkerTraits) -> None:
    """Run the task as the worker would, sending the task events the worker would send for it."""
    run = partial(trace_task, task, request["id"], request["args"], request["kwargs"], request)
    run = partial(run, hostname=request["hostname"], loader=app.loader, app=app)
    _receive(app, task, request)
    events = handoff_runs.task_events(worker.sends_task_events) and task.send_events
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


def _receive(app: Celery, task: Task[..., Any], request: dict[str, Any]) -> None:
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


def _rejected(
    task: Task[..., Any], request: dict[str, Any], exc: Reject, einfo: ExceptionInfo, send: Callable[..., None]
) -> None:
    """What the worker's main process does for a rejected message, which a local run does not have."""
    # celery-types' Reject lacks its attributes (requeue, reason).
    if not exc.requeue and REJECT_FAILS_THE_TASK:  # type: ignore[attr-defined]
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
        send("task-rejected", requeue=exc.requeue)  # type: ignore[attr-defined]


def _no_event(*args: Any, **kwargs: Any) -> None:
    pass
