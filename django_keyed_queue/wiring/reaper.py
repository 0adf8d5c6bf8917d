"""The reaper thread every worker's main process runs (``KEYED_QUEUE_WORKER_REAPER``)."""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import TYPE_CHECKING

from django.db import close_old_connections

from ..conf import settings
from ..process.outage import TRANSIENT
from ..records import forks

if TYPE_CHECKING:
    from celery import Celery

logger = logging.getLogger(__name__)


class WorkerReaper:
    """Reaps every ``KEYED_QUEUE_REAP_INTERVAL_SECONDS`` (unless ``periodic`` is False), and
    publishes stranded grants again when asked (after the worker's broker connection came back)."""

    def __init__(self, app: Celery, *, periodic: bool = True) -> None:
        self.app = app
        self.periodic = periodic
        self._wake = threading.Event()
        self._stopped = False
        self._lock = threading.Lock()
        #: When (``time.monotonic()``) the broker connection was lost, while a republish is asked for.
        self._lost_at: float | None = None
        self._thread = threading.Thread(target=self._run, name="keyed-queue-reaper", daemon=True)

    def start(self) -> WorkerReaper:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped = True
        self._wake.set()

    def republish_unstarted(self, lost_at: float) -> None:
        """Ask for every grant made before ``lost_at`` (``time.monotonic()``) and not started to go out again."""
        with self._lock:
            self._lost_at = lost_at if self._lost_at is None else min(lost_at, self._lost_at)
        self._wake.set()

    def _run(self) -> None:
        from ..ops.actions.recovery import reap, republish_unstarted

        while not self._stopped:
            # Spread the workers' passes so they do not all look at the same moment.
            self._wake.wait(settings.REAP_INTERVAL_SECONDS * random.uniform(0.8, 1.2) if self.periodic else None)
            self._wake.clear()
            if self._stopped:
                return
            with self._lock:
                lost_at, self._lost_at = self._lost_at, None
            try:
                with forks.held_off():
                    close_old_connections()
                    if lost_at is not None:
                        republish_unstarted(time.monotonic() - lost_at, app=self.app)
                    if self.periodic:
                        reap(app=self.app)
            except TRANSIENT as exc:
                if lost_at is not None:
                    self.republish_unstarted(lost_at)  # ask again at the next pass
                logger.warning("keyed queue reaper: Redis unreachable (%s); trying again", exc)
            except Exception:
                logger.exception("keyed queue reaper pass failed; trying again")
