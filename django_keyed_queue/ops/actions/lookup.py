"""What an operator's action acts on, read and checked: its key, its task's latest row, its registered
task and its stored message. Each action (``recovery``, ``stop``, ``run_now``, ``rebuild``) finds it here,
so that one that does not exist, or cannot be stored, is refused the same way everywhere."""

from __future__ import annotations

import logging

from celery import Celery, current_app

from ...exceptions import ActionRefused, InvalidArguments, InvalidKey, MessageRefused
from ...gate import MAX_KEY_LENGTH, Holder
from ...keyed_task.task import KeyedSerialTask
from ...messaging.message import JOIN_HEADER, TaskMessage
from ...process.state import operator_gate
from ...records import submissions
from ...records.columns import TASK_ID_MAX_LENGTH, shown, unstorable
from ...records.models import KeyedTask
from . import AUDIT_LOGGER

logger = logging.getLogger(AUDIT_LOGGER)


def celery_app(app: Celery | None) -> Celery:
    """The app an action is given, else the current one (the project's, in its processes)."""
    return app if app is not None else current_app


def operator_key(key: str) -> str:
    """An operator's key as a submission's key is checked: 1 to ``MAX_KEY_LENGTH`` characters of text
    a database can store, else ActionRefused."""
    problem = "is empty" if key == "" else unstorable(key, MAX_KEY_LENGTH)
    if problem:
        raise ActionRefused(f"a key is 1 to {MAX_KEY_LENGTH} characters of text; {shown(key)} {problem}")
    return key


def stored_message(row: KeyedTask, app) -> TaskMessage:
    """``row``'s stored message, decoded as the app accepts it, if it is the row's own task; else ActionRefused.

    The database may hold anything: a message of another task (another id, name or key) is never
    submitted in its place.
    """
    if not row.message:
        raise ActionRefused(
            f"task {row.task_id} cannot be submitted again: its message (what it ran with) was not kept"
        )
    try:
        message = TaskMessage.decode(row.message.encode(), app.conf.accept_content)
    except MessageRefused as refused:
        logger.error("keyed queue task %s key=%r: %s", row.task_id, row.key, refused)
        raise ActionRefused(str(refused)) from None
    task = registered_task(app, message.task_name)
    if not isinstance(task, KeyedSerialTask):
        raise ActionRefused(f"{message.task_name} is not a keyed task registered in this project")
    if (message.task_id, message.task_name) != (row.task_id, row.task_name):
        raise ActionRefused(
            f"the stored message of task {row.task_id} is not its own: it is {message.task_name}[{message.task_id}]"
        )
    try:
        key = task.key_for(message.args, message.kwargs)
    except (InvalidKey, InvalidArguments) as exc:
        raise ActionRefused(f"the stored message of task {row.task_id} makes no key: {exc}") from None
    if key != row.key:
        raise ActionRefused(
            f"the stored message of task {row.task_id} is not its own: its arguments make key {shown(key)}, "
            f"the task's is {shown(row.key)}"
        )
    return message


def join_id_of(row: KeyedTask, app) -> str:
    """The id a delayed task's message joins its key's queue with (see ``messages.JOIN_HEADER``)."""
    try:
        headers = TaskMessage.decode(row.message.encode(), app.conf.accept_content).options.get("headers") or {}
    except MessageRefused:
        headers = {}
    return str(headers.get(JOIN_HEADER) or row.task_id)


def latest_row(task_id: str) -> KeyedTask:
    """The latest submission of ``task_id`` (Celery reuses an id for a replacement, which comes later)."""
    if unstorable(task_id, TASK_ID_MAX_LENGTH):  # no row can have it; PostgreSQL would refuse the query
        raise ActionRefused(f"no keyed task has the id {shown(task_id)}")
    latest = KeyedTask.objects.filter(task_id=task_id).order_by("-id")
    row = latest.first()
    if row is None and submissions.write_due(operator_gate()):  # submitted so recently that its row is not written
        row = latest.first()
    if row is None:
        raise ActionRefused(f"no keyed task has the id {task_id!r}")
    return submissions.with_kept_end(operator_gate, row)


def slot_of(row: KeyedTask) -> Holder | None:
    """The slot ``row``'s ticket holds in the gate now for ``row``'s task, if any (one round trip)."""
    if row.ticket is None:
        return None
    return operator_gate().inspect(row.key, waiting_shown=0).held_by(row.ticket, row.task_id)


def registered_task(app, name: str):
    """The task ``name`` of ``app``, importing the project's task modules if this process has not.

    A ``manage.py`` or web process imports no task module until something
    needs one; Celery's worker imports them all (``autodiscover_tasks``) at start.
    """
    app = celery_app(app)
    if name not in app.tasks:
        app.loader.import_default_modules()
    return app.tasks.get(name)


def serial_limit(app, task_name: str) -> int:
    """The limit of task ``task_name`` (1 for a task this project does not register)."""
    return getattr(registered_task(app, task_name), "serial_limit", 1)
