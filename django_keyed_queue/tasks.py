"""Celery's ``autodiscover_tasks()`` loads ``<app>.tasks``: the upkeep tasks live in ``ops.tasks``."""

from .wiring.tasks import purge, reap

__all__ = ["purge", "reap"]
