"""One lease keeper per process renews every lease the process holds, in one gate call, and the pool
slots of its pooled runs, in one more call per pool (a pool's slot is held a lease and a margin).

Each renewal also moves the run's record ``heartbeat_at`` forward (through the
record buffer), so a record shows when its worker last proved alive.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from django.utils import timezone

from ..conf import settings
from ..gate import Gate, Lease
from ..records.recorder import Recorder
from ..records.statuses import Status
from ..records.transitions import Transition
from .outage import TRANSIENT

logger = logging.getLogger(__name__)


def renewal_seconds() -> float:
    """How often a process renews its leases (and beats on its runs' records): a third of a lease."""
    return float(settings.LEASE_SECONDS) / 3


@dataclass(frozen=True)
class Held:
    """Whose run a lease is: the record its renewals beat on."""

    task_id: str
    attempts: int
    #: The pool whose slot the run holds, renewed with its lease; None: none.
    pool: str | None = None


class LeaseKeeper:
    def __init__(self, gate: Callable[[], Gate], recorder: Recorder) -> None:
        self._gate = gate
        self._recorder = recorder
        self._lock = threading.Lock()
        self._held: dict[Lease, Held] = {}
        self._lost: set[Lease] = set()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def hold(self, lease: Lease, task_id: str, attempts: int, pool: str | None = None) -> None:
        with self._lock:
            self._held[lease] = Held(task_id, attempts, pool)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="keyed-queue-leases", daemon=True)
                self._thread.start()

    def stop_renewing(self, lease: Lease) -> None:
        with self._lock:
            self._held.pop(lease, None)
            self._lost.discard(lease)

    def _holds(self, lease: Lease) -> bool:
        with self._lock:
            return lease in self._held

    def is_lost(self, lease: Lease) -> bool:
        """True once a renewal found the lease gone: another holder may own the key."""
        with self._lock:
            return lease in self._lost

    def renew_now(self) -> None:
        with self._lock:
            held = dict(self._held)
        if not held:
            return
        gate = self._gate()
        outcome = gate.renew(held)
        pooled: dict[str, list[Lease]] = {}
        for lease, run in held.items():
            if run.pool is not None and outcome.get(lease):
                pooled.setdefault(run.pool, []).append(lease)
        for pool, leases in pooled.items():
            for lease, kept in gate.pool_renew(pool, leases).items():
                # Its slot went back: the pool may let another run beside it. Not so for a run that ended
                # meanwhile (its finish gave the slot back, after it was let go here).
                if not kept and self._holds(lease):
                    logger.warning("pool slot lost pool=%r key=%r ticket=%s", pool, lease.key, lease.ticket)
        now = timezone.now()
        with self._lock:
            for lease, renewed in outcome.items():
                if lease not in self._held:
                    continue  # it ended meanwhile
                if renewed:
                    run = held[lease]
                    beat = Transition(
                        run.task_id, lease.key, lease.ticket, Status.RUNNING, run.attempts, {"heartbeat_at": now}
                    )
                    self._recorder.buffer(beat)
                else:
                    logger.warning("lease lost key=%r ticket=%s", lease.key, lease.ticket)
                    self._lost.add(lease)

    def close(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(renewal_seconds()):
            try:
                self.renew_now()
            except TRANSIENT as exc:
                logger.warning("renewing keyed queue leases failed: Redis unreachable (%s); trying again", exc)
            except Exception:
                logger.exception("renewing keyed queue leases failed")
