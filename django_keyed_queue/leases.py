"""One lease keeper per worker process renews every lease the process holds."""

from __future__ import annotations

import logging
import os
import threading
import time

from .conf import settings
from .connection import TRANSIENT, get_gate
from .gate import Lease

logger = logging.getLogger(__name__)


class LeaseKeeper:
    def __init__(self) -> None:
        self._after_fork()
        os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()
        self._held: set[Lease] = set()
        self._lost: set[Lease] = set()
        self._thread: threading.Thread | None = None

    def hold(self, lease: Lease) -> None:
        with self._lock:
            self._held.add(lease)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="keyed-queue-leases", daemon=True)
                self._thread.start()

    def release(self, lease: Lease) -> None:
        with self._lock:
            self._held.discard(lease)
            self._lost.discard(lease)

    def is_lost(self, lease: Lease) -> bool:
        """True once a renewal found the lease gone: another holder may own the key."""
        with self._lock:
            return lease in self._lost

    def renew_now(self) -> None:
        with self._lock:
            held = list(self._held)
        if not held:
            return
        outcome = get_gate().renew(held)
        with self._lock:
            for lease, renewed in outcome.items():
                if not renewed and lease in self._held:
                    logger.warning("lease lost key=%r ticket=%s", lease.key, lease.ticket)
                    self._lost.add(lease)

    def _run(self) -> None:
        while True:
            time.sleep(settings.LEASE_SECONDS / 3)
            try:
                self.renew_now()
            except TRANSIENT as exc:
                logger.warning("renewing keyed queue leases failed: Redis unreachable (%s); trying again", exc)
            except Exception:
                logger.exception("renewing keyed queue leases failed")


keeper = LeaseKeeper()
