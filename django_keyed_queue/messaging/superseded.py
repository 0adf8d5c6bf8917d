"""What a coalescing submission does at once for the waiting task it replaced (``SubmitResult.superseded``).

Its result reads ``REVOKED``, as Celery's own revoke leaves it, and its idempotency
keys are handed to the task that replaced it. The replaced task's row ends ``superseded``
through the record the gate keeps for it (``records.submissions``), so a producer that dies
right after the gate's call leaves the row right; only its result then stays ``PENDING``.
A duplicate finds the task that runs whether or not a hand-over was made, and in whatever
order they were (``idempotency.resolve`` follows the chain): they only keep the chain short.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from celery.backends.base import DisabledBackend

from ..process.state import current
from ..records import idempotency

if TYPE_CHECKING:
    from .task_type import KeyedTaskProtocol

logger = logging.getLogger(__name__)


def replaced(task: KeyedTaskProtocol, key: str, task_id: str, by: str) -> None:
    """Task ``task_id`` of ``key`` was replaced by task ``by`` while it waited."""
    logger.debug("%s[%s] key=%r is superseded by %s: it will not run", task.name, task_id, key, by)
    idempotency.repoint(task_id, by)
    current().totals.count("finished", task, outcome="superseded")
    backend = task.backend
    if task.ignore_result or isinstance(backend, DisabledBackend):
        return
    try:
        backend.mark_as_revoked(task_id, f"superseded by {by}")
    except Exception:  # the result backend is down: the row says it, and the task never runs
        logger.warning("%s[%s]: its result could not be marked REVOKED", task.name, task_id, exc_info=True)
