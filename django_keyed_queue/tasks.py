"""Celery tasks the app provides: the reaper, for a beat schedule."""

from celery import shared_task

from .recovery import reap as reap_now

#: The beat entry that ``celery beat`` gets without configuration (see signals).
REAP_ENTRY = "keyed-queue-reap"


@shared_task(name="keyed_queue.reap", ignore_result=True)
def reap() -> str:
    """Recover runs whose worker was lost and messages that never arrived."""
    return reap_now().summary()
