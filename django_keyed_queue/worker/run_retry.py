"""A run's retry: ``self.retry()`` keeps the key held through the countdown, and the retry runs next."""

from __future__ import annotations

import logging
import sys
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from ..messaging.building import SendNow, send_to_gate
from ..messaging.message import TaskMessage, send_options, ticket_header
from ..process.outage import outlast_restart
from ..process.state import current
from ..records.statuses import Status
from .attempt_errors import ERRORS_HEADER, carried, earlier_errors, with_earlier
from .run_base import RunBase
from .run_end import failure_text

if TYPE_CHECKING:
    from celery.result import AsyncResult


logger = logging.getLogger(__name__)


class RunRetry(RunBase):
    def retry_in_place(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], options: dict[str, Any]
    ) -> AsyncResult[Any]:
        """``self.retry()``: keep the key held through the countdown; the retry runs next."""
        task, lease = self.task, self.lease
        countdown = options.get("countdown") or 0
        eta = options.get("eta")
        if isinstance(eta, datetime):
            countdown = max(0.0, (eta - timezone.now()).total_seconds())
        self.check_key(args, kwargs)  # a retry of another key's arguments would run outside its key
        options = send_options(task, args, kwargs, options)
        task_id = options.pop("task_id")
        # Celery's retry is called where the task caught its exception (or Celery did, for autoretry_for).
        exc = sys.exc_info()[1]
        error = failure_text(exc) if exc is not None else "retried"
        earlier = earlier_errors(task.request)
        options["headers"] = {**(options.get("headers") or {}), ERRORS_HEADER: carried(earlier, self.attempts, error)}

        def keep_slot_for_retry(message: TaskMessage, send_now: SendNow) -> None:
            gate, stored = current().gate, message.encode(task.serializer, blocks=task.blocks_on_failure)
            dispatch, _ = outlast_restart(
                lambda: gate.retry(lease.key, lease.ticket, lease.token, stored, countdown_seconds=countdown)
            )
            if dispatch is None:
                logger.warning("retry of a fenced ticket dropped key=%r ticket=%s", lease.key, lease.ticket)
                current().totals.count("fenced", task)
                return
            self.retried = True
            self.give_back_pool_slot()  # before the retry goes out: it asks its pool again at its start
            self._count_end("retried")
            retrying = with_earlier(f"it retries after: {error}", earlier)
            current().recorder.buffer(self._transition(Status.RETRYING, error=retrying))
            send_now(ticket_header(lease.key, lease.ticket, dispatch))

        return send_to_gate(task.app, task, task_id, args, kwargs, options, keep_slot_for_retry)
