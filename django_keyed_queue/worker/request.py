"""The worker's request of a keyed task: Celery's main process learns of a hard time limit here.

Celery kills a run past its hard time limit from the worker's main process,
which knows the message it killed, and so the attempt: its ticket header. The
attempt is ended there (see ``run.end_killed_run``); any other attempt
of the same task, such as the one a recovery started after this one stalled,
goes on.
"""

from __future__ import annotations

import logging

from celery.worker.request import Request

from ..records.statuses import Status
from .messages import HEADER
from .run import end_killed_run

logger = logging.getLogger(__name__)


class KeyedRequest(Request):
    def on_timeout(self, soft: bool, timeout: float) -> None:
        super().on_timeout(soft, timeout)
        if soft:
            return  # the run sees SoftTimeLimitExceeded and ends itself, naming its lease
        try:
            end_killed_run(
                self.id,
                self._request_dict.get(HEADER),  # type: ignore[attr-defined]  # Request's own, not in celery-types
                status=Status.FAILED,
                reason=f"hard time limit exceeded ({timeout}s)",
            )
        except Exception:
            logger.exception("keyed task %s hit its hard time limit; its ticket is kept until the reaper acts", self.id)
