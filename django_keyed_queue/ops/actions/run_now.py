"""Run now: a task that waits for a time, and for nothing else, starts now, once.

Three waits are for a time: a debounce (its message waits out an eta), its key's rate (a worker
holds its message until the key's next start is due), and a countdown or eta of its own (it has
not joined its key's queue yet). From the task's page or ``keyed_queue_run_now``:

- a granted task (debounced, or told to wait for its key's rate) is published again with its next
  dispatch and no eta, and that dispatch starts whatever the rate (``Gate.run_now``); the copy that
  waits is dropped when it comes, as an older dispatch;
- a delayed task joins its key's queue now: its message goes out again under a new join id with no
  eta, and the one that waits is refused when it comes (``Gate.refuse_join``); it then waits its turn
  behind the key's earlier tasks, as when it came due.

Repeated or racing, it runs the task once: the second names a dispatch or a join already used.
"""

from __future__ import annotations

import logging
from datetime import datetime

from celery import Celery, current_app
from django.utils import timezone

from ...exceptions import ActionRefused
from ...gate import KeySnapshot
from ...messaging.building import publish_stored
from ...messaging.dispatch import Published, publish
from ...messaging.message import JOIN_HEADER, sent_eta
from ...process.state import current, operator_gate
from ...records.models import KeyedTask
from ...records.statuses import Status
from ..display import at, did
from . import AUDIT_LOGGER
from .lookup import join_id_of, latest_row, registered_task, stored_message

#: The operator's actions share one audit logger (see the management commands' ``_key``).
logger = logging.getLogger(AUDIT_LOGGER)


def waits_for(row: KeyedTask, snapshot: KeySnapshot | None = None, app: Celery | None = None) -> str:
    """The time ``row``'s task waits for, as a sentence ends ("its key's rate (next start at ...)"); empty
    if it waits for no time (running, ended, waiting its turn, or dispatched and due now)."""
    app = app if app is not None else current_app
    now = timezone.now()
    if row.ticket is None:
        due = row.due_at
        return f"its countdown or eta ({at(due)})" if row.status == Status.WAITING and due and due > now else ""
    snapshot = snapshot if snapshot is not None else operator_gate().inspect(row.key, waiting_shown=0)
    holder = snapshot.held_by(row.ticket, row.task_id)
    if holder is None or holder.state != "granted" or holder.run_now:
        return ""
    registered = registered_task(app, row.task_name)
    # Its message decoded only for a debounced task: a list of them reads no message column otherwise.
    eta = _sent_eta(row, app) if getattr(registered, "serial_debounce_ms", 0) else None
    if eta is not None and eta > now:
        return f"its debounce (it starts at {at(eta)})"
    interval_ms = snapshot.interval_override_ms or getattr(registered, "serial_interval_ms", 0)
    if interval_ms and snapshot.since_last_start is not None and snapshot.since_last_start < interval_ms / 1000:
        return "its key's rate"
    return ""


def run_now(task_id: str, *, by: str = "an operator", app: Celery | None = None) -> str:
    """Start ``task_id``, which waits for a time, now; what was done. ActionRefused, with nothing done, if
    it waits for no time."""
    app = app if app is not None else current_app
    row = latest_row(task_id)
    snapshot = operator_gate().inspect(row.key, waiting_shown=0) if row.ticket is not None else None
    waits = waits_for(row, snapshot, app)
    if not waits:
        raise ActionRefused(_no_time(row, snapshot))
    if row.ticket is None:
        done = _join_now(row, app, by)
    else:
        assert snapshot is not None
        holder = snapshot.held_by(row.ticket, row.task_id)
        assert holder is not None  # waits_for found it granted
        grant = operator_gate().run_now(row.key, row.ticket, holder.dispatch)
        if grant is None:
            raise ActionRefused(f"task {task_id} moved on meanwhile (it started, or was run now already): look again")
        if publish(app, grant, at_once=True) is Published.BROKER_REFUSED:
            raise ActionRefused(f"the broker refused task {task_id}'s message; the reaper publishes it again soon")
        current().recorder.flush()
        done = f"published again to start now (dispatch {grant.dispatch}), instead of waiting for {waits}"
    logger.info("keyed queue task %s key=%r run now by %s", task_id, row.key, by)
    return f"{row.task_name}[{task_id}] {done}"


def _join_now(row: KeyedTask, app: Celery, by: str) -> str:
    """A delayed task joins its key's queue now, once: the copy that waits for its eta is refused."""
    message = stored_message(row, app)
    join_id = join_id_of(row, app)
    due_in = (row.due_at - timezone.now()).total_seconds() if row.due_at else 0.0
    if not operator_gate().refuse_join(row.key, join_id, due_in_seconds=due_in):
        raise ActionRefused(f"task {row.task_id} joined its key's queue just now, or was run now already: look again")
    publish_stored(app, message, {JOIN_HEADER: f"{join_id}:now", "eta": None})
    KeyedTask.objects.filter(pk=row.pk, ticket__isnull=True).update(due_at=timezone.now())
    return f"joins the queue of key {row.key!r} now instead of at {at(row.due_at)} (run now by {by})"


def _sent_eta(row: KeyedTask, app: Celery) -> datetime | None:
    try:
        return sent_eta(stored_message(row, app))
    except ActionRefused:
        return None


def run_now_refusal(row: KeyedTask, app: Celery | None = None) -> str:
    """Why ``row``'s task cannot be run now (it waits for no time); '' when it can."""
    snapshot = operator_gate().inspect(row.key, waiting_shown=0) if row.ticket is not None else None
    return "" if waits_for(row, snapshot, app) else _no_time(row, snapshot)


def _no_time(row: KeyedTask, snapshot: KeySnapshot | None) -> str:
    if row.status in (Status.WAITING, Status.DISPATCHED) and snapshot is not None:
        holder = snapshot.held_by(row.ticket, row.task_id) if row.ticket is not None else None
        if holder is None:
            return f"task {row.task_id} waits for its key's earlier tasks, not for a time: it starts in its turn"
        if holder.state == "granted":
            return f"task {row.task_id} is dispatched and waits for no time: a worker starts it as soon as it can"
        if holder.state == "running":
            return f"task {row.task_id} is running: only a task waiting for a time runs now"
    return (
        f"task {row.task_id} {did(row.status)}: only a task waiting for a debounce, an eta or its key's rate runs now"
    )
