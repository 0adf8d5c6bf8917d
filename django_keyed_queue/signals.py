"""Signal handlers wired in ``AppConfig.ready``."""

from __future__ import annotations

import logging
import random
import threading

from celery.signals import (
    beat_init,
    task_postrun,
    task_revoked,
    worker_init,
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
)
from django.core.signals import setting_changed
from django.db import close_old_connections
from django.dispatch import receiver

from . import handoff
from .conf import PREFIX, settings
from .connection import TRANSIENT, reset_gate
from .records import recorder

logger = logging.getLogger(__name__)
_reaper_stop = threading.Event()


@worker_init.connect
def _note_worker(sender=None, **_: object) -> None:
    handoff.note_worker(sender)


@worker_process_init.connect
def _fresh_client_per_process(**_: object) -> None:
    reset_gate()


@task_postrun.connect
def _run_kept_grant(sender=None, task_id: str = "", **_: object) -> None:
    """The finished task's result is stored: run the next task of its key here (local handoff)."""
    handoff.run_kept(sender.app, task_id)


@task_revoked.connect
def _cancel_revoked(sender=None, request=None, terminated: bool = False, expired: bool = False, **_: object) -> None:
    """Celery dropped a keyed task's message (expired, or revoked) before it ran: its key passes on."""
    from .exceptions import ActionRefused
    from .recovery import cancel
    from .task import KeyedSerialTask

    if terminated or request is None or not isinstance(sender, KeyedSerialTask):
        return  # a terminated run was running: its lease runs out and the reaper acts
    try:
        cancel(request.id, by="Celery: it expired" if expired else "Celery: it was revoked", app=sender.app)
    except ActionRefused as exc:
        logger.info("keyed task %s was dropped by Celery: %s", request.id, exc)
    except Exception:
        logger.exception("keyed task %s was dropped by Celery; its ticket is kept until the reaper acts", request.id)


@worker_process_shutdown.connect
def _flush_records(**_: object) -> None:
    recorder.flush()


@receiver(setting_changed)
def _settings_changed(setting: str, **_: object) -> None:
    if setting.startswith(PREFIX):
        reset_gate()


@worker_ready.connect
def _start_worker_reaper(sender=None, **_: object) -> None:
    """Every worker reaps, so recovery needs no beat process; reapers racing are safe."""
    if not settings.WORKER_REAPER:
        return
    _reaper_stop.clear()
    threading.Thread(target=_reap_forever, args=(sender.app,), name="keyed-queue-reaper", daemon=True).start()


@worker_shutdown.connect
def _stop_worker_reaper(**_: object) -> None:
    _reaper_stop.set()


def _reap_forever(app) -> None:
    from .recovery import reap

    # Spread the workers' passes so they do not all look at the same moment.
    while not _reaper_stop.wait(settings.REAP_INTERVAL_SECONDS * random.uniform(0.8, 1.2)):
        try:
            close_old_connections()
            reap(app=app)
        except TRANSIENT as exc:
            logger.warning("keyed queue reaper: Redis unreachable (%s); trying again", exc)
        except Exception:
            logger.exception("keyed queue reaper pass failed; trying again")


@beat_init.connect
def _schedule_upkeep(sender=None, **_: object) -> None:
    """Give ``celery beat`` the reaper and purge entries unless the project scheduled them itself."""
    from .tasks import PURGE_ENTRY, PURGE_INTERVAL_SECONDS, REAP_ENTRY

    entries = {
        REAP_ENTRY: {"task": "keyed_queue.reap", "schedule": settings.REAP_INTERVAL_SECONDS},
        PURGE_ENTRY: {"task": "keyed_queue.purge", "schedule": PURGE_INTERVAL_SECONDS},
    }
    configured = sender.app.conf.beat_schedule or {}
    sender.scheduler.update_from_dict({name: entry for name, entry in entries.items() if name not in configured})
