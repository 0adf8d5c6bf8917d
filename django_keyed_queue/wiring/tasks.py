"""Celery tasks the app provides: the reaper, for a beat schedule."""

from celery import shared_task

from ..ops.actions.recovery import reap as reap_now
from ..records.idempotency import purge as purge_now

#: The beat entries that ``celery beat`` gets without configuration (see signals).
REAP_ENTRY = "keyed-queue-reap"
PURGE_ENTRY = "keyed-queue-purge"
PURGE_INTERVAL_SECONDS = 3600.0


@shared_task(name="keyed_queue.reap", ignore_result=True)
def reap() -> str:
    """Recover runs whose worker was lost and messages that never arrived."""
    return reap_now().summary()


@shared_task(name="keyed_queue.purge", ignore_result=True)
def purge() -> int:
    """Delete expired idempotency keys."""
    return purge_now()
