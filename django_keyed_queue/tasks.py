"""Celery's ``autodiscover_tasks()`` loads ``<app>.tasks``: the upkeep tasks live in ``ops.tasks``."""

from .ops.tasks import purge, reap

__all__ = ["purge", "reap"]
