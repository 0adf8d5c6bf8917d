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
from dataclasses import dataclass, field
from typing import Any

from django.db import IntegrityError, close_old_connections, transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.module_loading import import_string
from kombu.utils.encoding import safe_repr

from .conf import settings
from .models import KeyedTask
from .statuses import STATUS_RANK

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
    #: Fields a missing row is created from (task_name, key, ticket, arguments, enqueued_at).
    create: dict[str, Any] | None = None

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
        )


def write(transition: Transition) -> None:
    """Apply one transition now, if it moves the record forward."""
    t = transition
    same_attempt_before = [s for s, rank in STATUS_RANK.items() if rank <= STATUS_RANK[t.status]]
    forward = Q(attempts__lt=t.attempts) | Q(attempts=t.attempts, status__in=same_attempt_before)
    values = {"status": t.status, "attempts": t.attempts, **t.fields}
    rows = KeyedTask.objects.filter(task_id=t.task_id)
    if rows.filter(forward).update(**values) or t.create is None or rows.exists():
        return
    # The producer died before writing the row, or its transaction never committed.
    try:
        with transaction.atomic():
            KeyedTask.objects.create(task_id=t.task_id, **{**t.create, **values})
    except IntegrityError:
        rows.filter(forward).update(**values)


class Recorder:
    """Per-process buffer of transitions, flushed by a daemon thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[str, Transition] = {}
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()
        os.register_at_fork(after_in_child=self._after_fork)
        atexit.register(self.flush)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()
        self._pending = {}
        self._thread = None
        self._wake = threading.Event()

    def record(self, transition: Transition) -> None:
        with self._lock:
            earlier = self._pending.get(transition.task_id)
            self._pending[transition.task_id] = earlier.merged_with(transition) if earlier else transition
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="keyed-queue-records", daemon=True)
                self._thread.start()

    def flush(self) -> None:
        """Write everything buffered so far (also called at process shutdown)."""
        with self._lock:
            batch, self._pending = self._pending, {}
        if not batch:
            return
        try:
            with transaction.atomic():
                for transition in batch.values():
                    write(transition)
        except Exception:
            logger.exception("writing %d keyed task records failed; will try again", len(batch))
            with self._lock:
                for transition in batch.values():
                    later = self._pending.get(transition.task_id)
                    self._pending[transition.task_id] = transition.merged_with(later) if later else transition
            raise

    def _run(self) -> None:
        while True:
            self._wake.wait(settings.RECORD_FLUSH_SECONDS)
            self._wake.clear()
            try:
                close_old_connections()
                self.flush()
            except Exception:  # logged in flush; keep the thread alive
                pass


recorder = Recorder()


def record(task_id: str, status: str, attempts: int, create: dict | None = None, **fields: Any) -> None:
    """Buffer a worker-side transition of ``task_id``; written within the flush interval."""
    recorder.record(Transition(task_id, status, attempts, fields, create))


def record_submission(**row: Any) -> None:
    """Write a new submission's row now (the producer's one synchronous write).

    A granted ticket can run, and its worker create the row from the message,
    before this write commits; then the row is already there and only the
    submission's own facts are added.
    """
    row.setdefault("enqueued_at", timezone.now())
    try:
        with transaction.atomic():
            KeyedTask.objects.create(**row)
    except IntegrityError:
        ticket = row.get("ticket")
        made_by_worker = KeyedTask.objects.filter(task_id=row["task_id"], key=row["key"], ticket=ticket)
        if ticket is None or not made_by_worker.update(enqueued_at=row["enqueued_at"], arguments=row["arguments"]):
            raise


def forget_submission(task_id: str) -> None:
    """Delete the row of a submission that failed after it was written."""
    KeyedTask.objects.filter(task_id=task_id).delete()
