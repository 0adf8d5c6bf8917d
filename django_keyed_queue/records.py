"""Writing KeyedTask records.

A submission's row is written at once, before ``apply_async`` returns: it is
the durable copy of a parked task. Later transitions happen on workers, on the
task's hot path, so they are buffered per process, merged per task, and
written in one transaction by a background thread every
``KEYED_QUEUE_RECORD_FLUSH_SECONDS``. Transitions of one task can come from
different processes in any order (the finishing worker marks the next task
dispatched while another worker already runs it), so a write only applies if
it moves the record forward: to a later attempt, or to a later status of the
same attempt.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from typing import Any

from django.db import DEFAULT_DB_ALIAS, IntegrityError, close_old_connections, connection, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field
from django.utils import timezone
from django.utils.module_loading import import_string
from kombu.utils.encoding import safe_repr
from kombu.utils.json import dumps as kombu_json
from kombu.utils.json import loads as kombu_loads

from .conf import settings
from .connection import get_gate
from .models import KeyedTask
from .statuses import STATUS_RANK, TERMINAL_STATUSES, Status

logger = logging.getLogger(__name__)

ARGUMENTS_MAX_LENGTH = 2000


def describe_arguments(task_name: str, args: tuple, kwargs: dict) -> str:
    """The arguments as stored on the record, after the project's redaction hook."""
    redact = settings.REDACT_ARGUMENTS
    if redact is not None:
        if isinstance(redact, str):
            redact = import_string(redact)
        args, kwargs = redact(task_name, args, kwargs)
    text = f"args={safe_repr(tuple(args))} kwargs={safe_repr(dict(kwargs))}"
    return text[:ARGUMENTS_MAX_LENGTH]


@dataclass
class Transition:
    task_id: str
    status: str
    attempts: int
    #: Other fields to set (timestamps, worker, error, ticket).
    fields: dict[str, Any] = field(default_factory=dict)
    #: What a missing row is created from: task_name, key, enqueued_at, and args and
    #: kwargs (described only if the row is really missing).
    create: dict[str, Any] | None = None
    #: The gate key holding this run's outcome, deleted once the record is written.
    outcome_key: str | None = None

    @property
    def order(self) -> tuple[int, int]:
        return (self.attempts, STATUS_RANK[self.status])

    def merged_with(self, later: Transition) -> Transition:
        first, last = (self, later) if self.order <= later.order else (later, self)
        return Transition(
            task_id=self.task_id,
            status=last.status,
            attempts=last.attempts,
            fields={**first.fields, **last.fields},
            create=last.create or first.create,
            outcome_key=last.outcome_key or first.outcome_key,
        )

    def to_json(self) -> bytes:
        """The transition as the gate keeps it until written (see ``finish``).

        Arguments go as the record shows them: any serializer's values may be in
        them, and JSON cannot hold them all.
        """
        create = self.create
        if create is not None and ("args" in create or "kwargs" in create):
            create = {k: v for k, v in create.items() if k not in ("args", "kwargs")}
            create["arguments"] = describe_arguments(
                create["task_name"], self.create.get("args", ()), self.create.get("kwargs", {})
            )
        return kombu_json(
            {"task_id": self.task_id, "status": self.status, "attempts": self.attempts,
             "fields": self.fields, "create": create}
        ).encode()  # fmt: skip

    @classmethod
    def from_json(cls, raw: bytes) -> Transition:
        data = kombu_loads(raw)  # kombu's JSON gives datetimes back as datetimes
        return cls(data["task_id"], data["status"], data["attempts"], data["fields"], data["create"])


#: Fields a transition may carry besides status and attempts.
FIELDS = ("ticket", "worker", "error", "dispatched_at", "started_at", "heartbeat_at", "finished_at")


@cache
def _update_sql(vendor: str) -> str:
    """One UPDATE for any transition, run with executemany over a batch.

    A transition that moves the row forward sets its fields; one that does not
    (it arrived late) only fills fields still empty, so no timestamp is lost.
    """
    qn = connection.ops.quote_name
    rank = "CASE {} {} END".format(
        qn("status"), " ".join(f"WHEN '{status}' THEN {r}" for status, r in STATUS_RANK.items())
    )
    # Named parameters: each value is sent once however often the statement uses it.
    forward = f"({qn('attempts')} < %(attempts)s OR ({qn('attempts')} = %(attempts)s AND {rank} <= %(rank)s))"
    sets = [
        f"{qn(f)} = CASE WHEN {forward} THEN COALESCE(%({f})s, {qn(f)}) ELSE COALESCE({qn(f)}, %({f})s) END"
        for f in FIELDS
    ]
    # Status and attempts last: every SET must see the row as it was.
    sets += [f"{qn(f)} = CASE WHEN {forward} THEN %({f})s ELSE {qn(f)} END" for f in ("status", "attempts")]
    return f"UPDATE {qn(KeyedTask._meta.db_table)} SET {', '.join(sets)} WHERE {qn('task_id')} = %(task_id)s"


@cache
def _fields() -> tuple[tuple[str, Field], ...]:
    return tuple((name, KeyedTask._meta.get_field(name)) for name in FIELDS)


def _update_params(t: Transition, db: BaseDatabaseWrapper) -> dict[str, Any]:
    given = t.fields
    params = {name: _db_value(db, model_field, given.get(name)) for name, model_field in _fields()}
    params.update(status=t.status, attempts=t.attempts, rank=STATUS_RANK[t.status], task_id=t.task_id)
    return params


def write(*transitions: Transition) -> None:
    """Apply transitions now, in one transaction; each moves its row forward or fills its gaps."""
    db = connections[DEFAULT_DB_ALIAS]
    params = [_update_params(t, db) for t in transitions]
    with transaction.atomic():
        with db.cursor() as cursor:
            cursor.executemany(_update_sql(db.vendor), params)
            # Every row matched (task ids are distinct): none to create, no need to look.
            all_found = cursor.rowcount == len(transitions)
        creatable = {t.task_id: t for t in transitions if t.create is not None}
        if creatable and not all_found:
            existing = set(KeyedTask.objects.filter(task_id__in=creatable).values_list("task_id", flat=True))
            for task_id in creatable.keys() - existing:
                _create_missing(creatable[task_id])


def _create_missing(t: Transition) -> None:
    """The producer died before writing the row, or its transaction has not committed."""
    create = dict(t.create or {})
    args, kwargs = create.pop("args", ()), create.pop("kwargs", {})
    if "arguments" not in create:
        create["arguments"] = describe_arguments(create["task_name"], args, kwargs)
    try:
        with transaction.atomic():
            KeyedTask.objects.create(task_id=t.task_id, status=t.status, attempts=t.attempts, **create, **t.fields)
    except IntegrityError:  # the producer's row committed meanwhile
        db = connections[DEFAULT_DB_ALIAS]
        with db.cursor() as cursor:
            cursor.execute(_update_sql(db.vendor), _update_params(t, db))


class Recorder:
    """Per-process buffer of transitions, flushed by a daemon thread."""

    def __init__(self) -> None:
        self._after_fork()
        os.register_at_fork(after_in_child=self._after_fork)
        atexit.register(self.flush)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[str, Transition] = {}
        self._thread: threading.Thread | None = None

    def record(self, transition: Transition) -> None:
        with self._lock:
            earlier = self._pending.get(transition.task_id)
            self._pending[transition.task_id] = earlier.merged_with(transition) if earlier else transition
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="keyed-queue-records", daemon=True)
                self._thread.start()

    def peek(self, task_id: str) -> Transition | None:
        with self._lock:
            return self._pending.get(task_id)

    def discard(self) -> None:
        """Drop what is buffered without writing it (a test run whose database is gone)."""
        with self._lock:
            self._pending = {}

    def flush(self) -> None:
        """Write everything buffered so far (also called at process shutdown)."""
        with self._lock:
            batch, self._pending = self._pending, {}
        if not batch:
            return
        try:
            write(*batch.values())
            written = [(t.outcome_key, t.task_id) for t in batch.values() if t.outcome_key]
            if written:
                _forget_outcomes(written)
        except Exception:
            logger.exception("writing %d keyed task records failed; will try again", len(batch))
            with self._lock:
                for transition in batch.values():
                    later = self._pending.get(transition.task_id)
                    self._pending[transition.task_id] = transition.merged_with(later) if later else transition
            raise

    def _run(self) -> None:
        while True:
            time.sleep(settings.RECORD_FLUSH_SECONDS)
            try:
                # The thread's connection is kept while there is work: reconnecting
                # every pass cost about 0.5 ms (SQLite) each time.
                if self._pending:
                    self.flush()  # logs its own failure
                else:
                    close_old_connections()
            except Exception:  # the thread must outlive a database that is down: retry on a new connection
                logger.debug("keyed task record flusher pass failed", exc_info=True)
                try:
                    connection.close()
                except Exception:
                    pass


recorder = Recorder()


def record(task_id: str, status: str, attempts: int, create: dict | None = None, **fields: Any) -> None:
    """Buffer a worker-side transition of ``task_id``; written within the flush interval."""
    recorder.record(Transition(task_id, status, attempts, fields, create))


def record_dispatched(task_id: str, at: datetime) -> None:
    """Buffer that ``task_id``'s granted message went out (or that this process kept it to run)."""
    record(task_id, Status.DISPATCHED, 0, dispatched_at=at)


def end_of_run(task_id: str, status: str, attempts: int, **fields: Any) -> Transition:
    """The record of a run's end, with what is still buffered for it (kept in the gate by finish)."""
    transition = Transition(task_id, status, attempts, fields)
    earlier = recorder.peek(task_id)
    return earlier.merged_with(transition) if earlier else transition


def record_end(transition: Transition, key: str) -> None:
    """Buffer a run's end whose outcome the gate keeps under ``key`` until it is written."""
    transition.outcome_key = key
    recorder.record(transition)


def _forget_outcomes(written: list[tuple[str, str]]) -> None:
    try:
        get_gate().forget_outcomes(written)
    except Exception:  # the reaper writes them again later, which changes nothing
        logger.warning("could not delete %d written outcomes from the gate", len(written), exc_info=True)


@cache
def _insert_sql(vendor: str) -> tuple[str, tuple[Field, ...], tuple]:
    """The submission INSERT, its fields and their defaults, built once: it runs on every
    submission, and the ORM's model machinery would cost about as much as the write."""
    fields = tuple(f for f in KeyedTask._meta.concrete_fields if not f.primary_key)
    qn = connection.ops.quote_name
    columns = ", ".join(qn(f.column) for f in fields)
    placeholders = ", ".join(["%s"] * len(fields))
    defaults = tuple(f.get_default() for f in fields)  # constants: no field has a callable default
    return f"INSERT INTO {qn(KeyedTask._meta.db_table)} ({columns}) VALUES ({placeholders})", fields, defaults


def _db_value(db: BaseDatabaseWrapper, model_field: Field, value: Any) -> Any:
    # Text, numbers and None go to the driver as they are; an aware datetime needs only the
    # backend's conversion (the field's own checks cost twice as much, on every write).
    if value is None or isinstance(value, (str, int)):
        return value
    if isinstance(value, datetime) and value.tzinfo is not None:
        return db.ops.adapt_datetimefield_value(value)
    return model_field.get_db_prep_save(value, db)


def record_submission(**row: Any) -> None:
    """Write a new submission's row now (the producer's one synchronous write).

    A granted ticket can run, and its worker create the row from the message,
    before this write commits; then the row is already there and only the
    submission's own facts are added.
    """
    row.setdefault("enqueued_at", timezone.now())
    db = connections[DEFAULT_DB_ALIAS]  # resolved once: each use of the ``connection`` proxy costs a lookup
    sql, fields, defaults = _insert_sql(db.vendor)
    params = [_db_value(db, f, row.get(f.attname, d)) for f, d in zip(fields, defaults, strict=True)]
    try:
        # A savepoint only inside the caller's transaction: in autocommit the INSERT is atomic alone.
        with transaction.atomic() if db.in_atomic_block else nullcontext():
            with db.cursor() as cursor:
                cursor.execute(sql, params)
    except IntegrityError:
        ticket = row.get("ticket")
        made_by_worker = KeyedTask.objects.filter(task_id=row["task_id"], key=row["key"], ticket=ticket)
        if ticket is None or not made_by_worker.update(enqueued_at=row["enqueued_at"], arguments=row["arguments"]):
            raise


def forget_submission(task_id: str) -> None:
    """Delete the row of a submission that failed after it was written."""
    KeyedTask.objects.filter(task_id=task_id).delete()


def settle(task_id: str, status: str, **fields: Any) -> None:
    """Set a record's status now, whatever it was, unless it already ended (the reaper's write).

    The reaper knows better than the buffered writes of a worker it gave up on;
    a record that reached a terminal status keeps it.
    """
    KeyedTask.objects.filter(task_id=task_id).exclude(status__in=TERMINAL_STATUSES).update(status=status, **fields)
