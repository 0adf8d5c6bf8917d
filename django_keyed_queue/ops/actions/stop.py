"""Stop: end a running task's run itself, and only then let its key move on.

An operator's Stop, from the task's page, the live keys page or ``keyed_queue_stop``, is noted at
the gate first (``Gate.stop``: the run is not recovered, and keeps its key's slot), then sent as
Celery's revoke with ``terminate`` to the worker that runs it, with the signal the operator picks.
That worker's main process kills the child process, watches it end and only then releases the
key (``worker.killed``): the task fails, or blocks its key, "stopped by" the operator, and the
key's next task starts after it, never beside it. A worker that does not answer, or a process
that outlives the signal, keeps the key until the run's lease ends.

Repeated or racing, it stops one run once: the first stop is the one its record names, and a
second only sends the signal again (SIGKILL after a SIGTERM the task ignored).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from celery import Celery, current_app
from django.core.cache import cache

from ...exceptions import ActionRefused
from ...gate import Holder, Stopping
from ...messaging.recovered import stopped_text
from ...process.state import operator_gate
from ...records.columns import shown
from ...records.models import KeyedTask
from ..display import did, from_epoch, since
from . import AUDIT_LOGGER
from .lookup import latest_row, slot_of

#: The operator's actions share one audit logger (see the management commands' ``_key``).
logger = logging.getLogger(AUDIT_LOGGER)

#: The signals a Stop may send: SIGTERM lets the process run its exit handlers, SIGKILL cannot be ignored.
SIGNALS = ("SIGTERM", "SIGKILL")
#: Celery's pools whose processes a revoke with terminate ends (each run has a process of its own).
ENDS_RUNS = ("prefork",)
#: The argument that marks Celery's revoke as a Stop's (see ``signals``).
STOP_ONLY = "keyed_queue_stop"
POOL_CACHE_SECONDS = 60
POOL_TIMEOUT_SECONDS = 1.0


@dataclass(frozen=True)
class Stopped:
    """What a Stop did: the run's task, who stopped it first, and where the signal went."""

    task: KeyedTask
    stopping: Stopping
    by: str
    signal: str
    worker: str

    def said(self) -> str:
        where = f"worker {self.worker}"
        first = ""
        if (self.stopping.by, self.stopping.how) != (self.by, self.signal):
            ago = since(from_epoch(self.stopping.since_ms / 1000))
            first = f"; it was being {stopped_text(self.stopping)} already, since {ago} ago"
        return (
            f"{self.signal} sent to {where} to end the run of {self.task.task_name}[{self.task.task_id}]{first}. "
            "Its key's next task starts once the run has ended (its worker says so, or its lease ends)."
        )


def stop(
    task_id: str,
    *,
    by: str = "an operator",
    signal: str = "SIGTERM",
    dispatch: int | None = None,
    app: Celery | None = None,
) -> Stopped:
    """Stop ``task_id``'s running attempt with ``signal``; ActionRefused, with nothing done, if it does not
    run, its worker's pool cannot end a run, or the signal is not one of ``SIGNALS``. ``dispatch``: the
    attempt's, as the operator saw it (None: the one running now)."""
    if signal not in SIGNALS:
        raise ActionRefused(f"a run is stopped with {' or '.join(SIGNALS)}, not {shown(signal)}")
    app = app if app is not None else current_app
    row = latest_row(task_id)
    holder = running_holder(row)
    if dispatch is not None and dispatch != holder.dispatch:
        raise ActionRefused(
            f"task {task_id} moved on from the attempt you saw (dispatch {dispatch}, now {holder.dispatch}): look again"
        )
    worker = row.worker if row.attempts == holder.attempts else ""  # the record may be an attempt behind
    refusal = cannot_end(app, worker)
    if refusal:
        raise ActionRefused(refusal)
    assert row.ticket is not None  # it holds a slot
    stopping = operator_gate().stop(row.key, row.ticket, holder.dispatch, by=by, how=signal)
    if stopping is None:
        raise ActionRefused(f"task {task_id} is no longer running that attempt: it ended or moved on; look again")
    # Celery's revoke with terminate, marked so that the worker forgets the id once it killed the run: a
    # Retry of a task that then blocks its key runs it again as itself, which a revoked id would not.
    arguments = {"task_id": task_id, "terminate": True, "signal": signal, STOP_ONLY: True}
    app.control.broadcast("revoke", arguments=arguments, destination=[worker])
    logger.info("keyed queue task %s key=%r stopped by %s (%s, to %s)", task_id, row.key, by, signal, worker)
    return Stopped(row, stopping, by, signal, worker)


def stop_refusal(row: KeyedTask, holder: Holder | None) -> str:
    """Why ``row``'s task cannot be stopped now (``holder``: its slot, ``recovery.slot_of``); '' when it can."""
    if holder is not None and holder.state == "running":
        return ""
    state = "it was dispatched and has not started: cancel it instead" if holder else f"it {did(row.status)}"
    return f"task {row.task_id} is not running ({state}); only a running task is stopped"


def running_holder(row: KeyedTask) -> Holder:
    """The running slot ``row``'s task holds now, or ActionRefused."""
    holder = slot_of(row)
    if refusal := stop_refusal(row, holder):
        raise ActionRefused(refusal)
    assert holder is not None  # it runs
    return holder


def cannot_end(app: Celery, worker: str) -> str:
    """Why a run on ``worker`` cannot be stopped now (empty when it can): its worker is not recorded yet, did
    not say which of Celery's pools it runs, or runs one that cannot end one run. Never assumed able."""
    if not worker:
        return (
            "its worker is not recorded yet (a run's worker writes its start within a records pass, about a "
            "second): look again in a moment"
        )
    pool = worker_pool(app, worker)
    if pool is None:
        return (
            f"worker {worker} did not say within {POOL_TIMEOUT_SECONDS:g} s which of Celery's pools it runs (a "
            "busy solo worker cannot answer), and only a prefork pool ends one run: look again, or shut that "
            f"worker down (celery -A <project> control shutdown --destination {worker}) and its lease ends"
        )
    if pool in ENDS_RUNS:
        return ""
    return (
        f"worker {worker} runs Celery's {pool} pool, which cannot end one running task (Celery ends a run by "
        f"ending its process: the prefork pool). Instead: shut that worker down (celery -A <project> control "
        f"shutdown --destination {worker}), and its lease ends; or Release the key, knowing the run goes on "
        "beside the next task until it ends on its own."
    )


def worker_pool(app: Celery, worker: str) -> str | None:
    """The name of Celery's pool ``worker`` runs ("prefork", "threads", "solo", ...), as it answers Celery's
    inspect, cached; None if it did not answer."""
    cache_key = f"keyed_queue:pool:{worker}"
    pool = cache.get(cache_key)
    if pool is not None:
        return pool
    try:
        stats = app.control.inspect([worker], timeout=POOL_TIMEOUT_SECONDS).stats() or {}
    except Exception as exc:  # the broker away: the stop goes out, and the lease decides if nobody acts on it
        logger.info("keyed queue: Celery's inspect of worker %s failed: %r", worker, exc)
        return None
    reply = stats.get(worker) if isinstance(stats, dict) else None
    implementation = reply.get("pool", {}).get("implementation") if isinstance(reply, dict) else None
    if not isinstance(implementation, str):
        return None
    # e.g. "celery.concurrency.prefork:TaskPool", "celery.concurrency.thread:TaskPool"
    pool = implementation.rsplit(":", 1)[0].rsplit(".", 1)[-1]
    pool = {"thread": "threads"}.get(pool, pool)
    cache.set(cache_key, pool, POOL_CACHE_SECONDS)
    return pool
