"""Everything one OS process keeps for the keyed queue, in one object: ``current()``.

A web process, a management command, a worker's main process and each of its
child processes has its own: the gate's Redis client, the record buffer, the
lease keeper and the counts for the metrics. It is made on first use in each
process, never shared across a fork (a forked child makes its own and never
touches its parent's sockets or threads), and closed at exit: what is
buffered is written.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..conf import settings
from ..gate import Gate
from ..gate.clients import close, connect
from ..gate.views import ConsoleGate, OperatorGate, ProducerGate, WorkerGate
from ..records.recorder import Recorder
from ..records.transitions import Transition
from .leases import LeaseKeeper
from .totals import Totals

if TYPE_CHECKING:
    from celery import Celery

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerTraits:
    """What a Celery worker applies to every message, noted in its main process (``worker_init``)
    and inherited by its child processes: a task run by local handoff gets the same."""

    time_limits: tuple[float | None, float | None] = (None, None)
    sends_task_events: bool = False
    #: The app's ``accept_content`` as the worker read it at its start, as its consumer did (None: read the app's).
    accept_content: frozenset[str] | None = None
    #: Noted by a Celery worker at its start (its ``time_limits`` then include the app's own); False elsewhere.
    in_worker: bool = False

    @classmethod
    def of(cls, worker: Any) -> WorkerTraits:
        """The traits of a Celery worker (its ``WorkController``) as it starts.

        Only an ``accept_content`` that is a list of names is kept; anything else is read from the app at each
        use, and refused there, as before: noting it never fails, which would lose the worker's time limits
        (Celery logs a receiver's error and goes on)."""
        accept = worker.app.conf.accept_content
        names = isinstance(accept, (list, tuple, set, frozenset)) and all(isinstance(a, str) for a in accept)
        limits = (worker.time_limit, worker.soft_time_limit)
        return cls(limits, bool(worker.task_events), frozenset(accept) if names else None, in_worker=True)

    def accepted(self, app: Celery) -> Iterable[str]:
        """The content types a stored message may be decoded from here: the worker's, noted once at its start,
        else the app's as it is now (each read of Celery's configuration in a Django project looks the name up
        in Django's settings too)."""
        return app.conf.accept_content if self.accept_content is None else self.accept_content


class Process:
    def __init__(self, worker: WorkerTraits) -> None:
        self.pid = os.getpid()
        #: A Celery worker's own in it and its child processes; no limits and no events elsewhere.
        self.worker = worker
        self._lock = threading.Lock()
        self._gate: Gate | None = None
        self.recorder = Recorder(on_written=self._forget_written)
        self.leases = LeaseKeeper(lambda: self.gate, self.recorder)
        self.totals = Totals(lambda: self.gate)

    @property
    def gate(self) -> Gate:
        gate = self._gate
        if gate is None:
            with self._lock:
                if self._gate is None:
                    self._gate = _connect()
                gate = self._gate
        return gate

    def reset_gate(self) -> None:
        """Drop the Redis client: the next use connects with the settings as they are now."""
        with self._lock:
            gate, self._gate = self._gate, None
        if gate is not None:
            close(gate.client)

    def close(self) -> None:
        """Write what is buffered and let go of the connection (process exit, child process shutdown)."""
        if self.pid != os.getpid():
            return  # a forked child exiting: its parent's buffer and sockets are not its own
        self.leases.close()
        try:
            self.recorder.close()
        except Exception:
            logger.warning("the keyed queue's last record writes failed at shutdown", exc_info=True)
        self.totals.close()
        self.reset_gate()

    def _forget_written(self, written: list[Transition]) -> None:
        outcomes = [(t.outcome_key, t.outcome_field) for t in written if t.outcome_key]
        records = [(t.key, t.ticket) for t in written if t.record_kept]
        try:
            self.gate.forget_outcomes(outcomes, records=records)
        except Exception:  # the reaper and the writers write them again later, which changes nothing
            logger.warning("could not delete %d written records from the gate", len(written), exc_info=True)


def _connect() -> Gate:
    client = connect(
        settings.REDIS_URL,
        cluster=settings.REDIS_CLUSTER,
        sentinel_master=settings.REDIS_SENTINEL_MASTER,
        socket_connect_timeout=5,
        socket_timeout=30,
        health_check_interval=30,
    )
    return Gate(
        client,
        lease_seconds=settings.LEASE_SECONDS,
        dispatch_timeout_seconds=settings.DISPATCH_TIMEOUT_SECONDS,
        idle_horizon_seconds=settings.IDLE_HORIZON_SECONDS,
        record_delay_seconds=settings.RECORD_DELAY_SECONDS,
        wait_replicas=settings.REDIS_WAIT_REPLICAS,
        wait_timeout_seconds=settings.REDIS_WAIT_TIMEOUT_SECONDS,
    )


_current: Process | None = None
_lock = threading.Lock()
#: A worker's traits, carried from its main process into each forked child process.
_inherited = WorkerTraits()


def current() -> Process:
    """This process's keyed queue state, made on first use (a forked child starts with none: see below)."""
    global _current
    process = _current
    if process is not None:
        return process
    with _lock:
        if _current is None:
            _current = Process(worker=_inherited)
            atexit.register(_current.close)
        return _current


def _forget_in_child() -> None:
    # current() is on every run's hot path, so it reads no pid: a forked child drops its parent's state here,
    # and takes a new lock, in case the fork copied the lock held.
    global _current, _lock
    _current, _lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_in_child)


def get_gate() -> Gate:
    """This process's gate client."""
    return current().gate


# Each room's view of this process's gate (``gate/views.py``); returning the gate as each is what
# makes the type checker hold ``Gate`` to every view.


def producer_gate() -> ProducerGate:
    return current().gate


def worker_gate() -> WorkerGate:
    return current().gate


def operator_gate() -> OperatorGate:
    return current().gate


def console_gate() -> ConsoleGate:
    return current().gate


def note_worker(traits: WorkerTraits) -> None:
    """In a worker's main process, before its pool forks: the traits its processes run tasks with."""
    global _inherited
    _inherited = traits
    current().worker = traits


def _after_fork_in_child() -> None:
    # Another thread of the parent may have held the lock when it forked: the child gets a
    # new one. The parent's object stays the parent's; the child makes its own on first use.
    global _lock, _current
    _lock = threading.Lock()
    _current = None


os.register_at_fork(after_in_child=_after_fork_in_child)
