"""A process's buffer of record transitions, written in batches by a background thread.

A submission's row is written from the gate (``submissions``).
Later transitions happen on workers, on the task's hot path, so they are
buffered per process, merged per task, and written in one transaction every
``KEYED_QUEUE_RECORD_FLUSH_SECONDS``. Transitions of one task can come from
different processes in any order (the finishing worker marks the next task
dispatched while another worker already runs it): ``KeyedTask.objects.apply``
only moves a row forward.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import replace

from django.db import close_old_connections, connections, router

from ..conf import settings
from . import forks
from .manager import gave_way_to_a_lock
from .models import KeyedTask
from .transitions import Transition

logger = logging.getLogger(__name__)

#: How long past the record delay a transition waits for its submission's row before it makes the row
#: itself (the record kept for it in the gate was lost with Redis, or no worker's main process writes rows).
CREATE_MISSING_GRACE_SECONDS = 2.0


#: How long the background pass waits for a lock another transaction holds before it puts its batch back
#: for the next pass. That transaction may be the very one a ``flush()`` waits in, for this pass to end
#: (an operator's action under ``ATOMIC_REQUESTS``), which would otherwise wait for good on PostgreSQL.
#: SQLite's default wait; 1 s gave way 4 times in a busy PostgreSQL benchmark's three minutes.
BACKGROUND_LOCK_WAIT_SECONDS = 5.0


#: Rows a process remembers it made: a later transition of one of them updates it without trying to insert.
MADE_ROWS_KEPT = 4096


def create_missing_after() -> float:
    """Seconds a transition whose row is missing waits for the workers' writers to write it."""
    return float(settings.RECORD_DELAY_SECONDS) + CREATE_MISSING_GRACE_SECONDS


class Recorder:
    """Transitions buffered in one process; ``on_written`` gets the written transitions that name what the
    gate keeps for them until then (a run's outcome, a submission's record)."""

    def __init__(self, on_written: Callable[[list[Transition]], None] | None = None) -> None:
        self._on_written = on_written
        self._lock = threading.Lock()
        # One flush at a time: a flush returns once all recorded before it was written or put back, also
        # when the background thread took the batch a moment earlier (an operator's action reads rows next).
        self._flushing = threading.Lock()
        self._pending: dict[tuple[str, str, int], Transition] = {}
        #: The submissions whose rows this process inserted lately, oldest first.
        self._made: dict[tuple[str, str, int], None] = {}
        #: Those whose rows the flush under way inserts: a run that ends meanwhile updates its row.
        self._making: set[tuple[str, str, int]] = set()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def buffer(self, transition: Transition) -> None:
        with self._lock:
            made = transition.submission in self._made or transition.submission in self._making
            if transition.insert_first and made:
                # This process made its row already, or is making it: inserting it again would fail the
                # whole batch over to one statement a row. Put back unwritten, the maker keeps its insert.
                transition = replace(transition, insert_first=False)
            earlier = self._pending.get(transition.submission)
            self._pending[transition.submission] = earlier.merged_with(transition) if earlier else transition
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="keyed-queue-records", daemon=True)
                self._thread.start()

    def discard(self) -> list[Transition]:
        """Drop what is buffered and not yet written (a process whose database is gone); returns it."""
        with self._lock:
            dropped, self._pending = list(self._pending.values()), {}
        return dropped

    def peek(self, submission: tuple[str, str, int]) -> Transition | None:
        """What is buffered for ``(task_id, key, ticket)``."""
        with self._lock:
            return self._pending.get(submission)

    def flush(self, *, wait_for_rows: bool = True, held_too: bool = True, lock_wait: float | None = None) -> None:
        """Write everything buffered so far; ``wait_for_rows=False`` (at shutdown) makes missing rows now;
        ``held_too=False`` (the background thread's passes) leaves those not to be tried yet.

        A run that ended while its submission's record was still kept in the gate writes its row
        once, in its final state. Another transition whose row is not there yet waits, buffered, for
        the submission's row, which a worker's ``RecordWriter`` writes once the record is
        ``KEYED_QUEUE_RECORD_DELAY_SECONDS`` old, for at most ``create_missing_after()``; then one that
        can makes the row itself. One that cannot (a grant's dispatch) is not tried before the delay.

        ``lock_wait`` (the background thread's passes): seconds to wait for a lock another transaction
        holds; then the batch is buffered again, and the flush returns.
        """
        with self._flushing:
            self._flush(wait_for_rows, held_too, lock_wait)

    def _flush(self, wait_for_rows: bool, held_too: bool, lock_wait: float | None) -> None:
        now = time.monotonic()
        with self._lock:
            batch, self._pending = self._pending, {}
            if not held_too:  # not yet: kept for a later pass
                self._pending = {s: t for s, t in batch.items() if t.not_before is not None and t.not_before > now}
                batch = {s: t for s, t in batch.items() if s not in self._pending}
            self._making = {s for s, t in batch.items() if t.insert_first}
        if not batch:
            return
        try:
            self._write(batch, wait_for_rows, lock_wait)
        finally:
            with self._lock:
                self._making = set()

    def _write(
        self, batch: dict[tuple[str, str, int], Transition], wait_for_rows: bool, lock_wait: float | None
    ) -> None:
        try:
            create_after = create_missing_after() if wait_for_rows else None
            # A transition refused is set aside (logged): written again, it would only be refused again.
            waiting = KeyedTask.objects.apply_setting_aside(
                list(batch.values()), create_after=create_after, lock_wait=lock_wait
            )
        except Exception as exc:
            if lock_wait is not None and gave_way_to_a_lock(exc):
                logger.info(
                    "writing %d keyed task records gave way to a lock another transaction holds"
                    " (waited at most %.1f s); will try again",
                    len(batch),
                    lock_wait,
                )
                self._put_back(batch.values())
                return
            logger.exception("writing %d keyed task records failed; will try again", len(batch))
            self._put_back(batch.values())
            raise
        if waiting:
            now = time.monotonic()
            for t in waiting:
                del batch[t.submission]
            self._put_back(replace(t, missing_since=t.missing_since or now) for t in waiting)
        made = [t.submission for t in batch.values() if t.insert_first]
        if made:
            with self._lock:
                self._made.update(dict.fromkeys(made))
                while len(self._made) > MADE_ROWS_KEPT:
                    del self._made[next(iter(self._made))]
        written = [t for t in batch.values() if t.outcome_key or t.record_kept]
        if written and self._on_written is not None:
            self._on_written(written)

    def _put_back(self, transitions: Iterable[Transition]) -> None:
        """Buffer again transitions that were not written, before any recorded since."""
        with self._lock:
            for transition in transitions:
                later = self._pending.get(transition.submission)
                self._pending[transition.submission] = transition.merged_with(later) if later else transition

    def close(self) -> None:
        """Stop the background thread and write what is left."""
        self._stop.set()
        self.flush(wait_for_rows=False)
        if self._thread is not None:
            self._thread.join(BACKGROUND_LOCK_WAIT_SECONDS + 1.0)

    def _run(self) -> None:
        while not self._stop.wait(settings.RECORD_FLUSH_SECONDS):
            with forks.held_off():
                self._pass()
        with forks.held_off():
            connections.close_all()  # this thread's own: a server's connection ends with the thread

    def _pass(self) -> None:
        try:
            # The thread's connection is kept while there is work: reconnecting
            # every pass cost about 0.5 ms (SQLite) each time.
            if self._pending:
                self.flush(held_too=False, lock_wait=BACKGROUND_LOCK_WAIT_SECONDS)  # logs its own failure
            else:
                close_old_connections()
        except Exception:  # the thread must outlive a database that is down: retry on a new connection
            logger.debug("keyed task record flusher pass failed", exc_info=True)
            try:
                connections[router.db_for_write(KeyedTask)].close()
            except Exception:
                pass
