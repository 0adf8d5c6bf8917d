"""Keep the keyed queue's records in a database of their own: ``KEYED_QUEUE_DATABASE``.

    DATABASE_ROUTERS = ["django_keyed_queue.records.router.KeyedQueueRouter"]
    KEYED_QUEUE_DATABASE = "queue"   # an alias of DATABASES

Reads, writes and migrations of the app's models go to that alias (migrate it with
``manage.py migrate --database queue``); everything else is left to the project's
other routers. Without the setting the router has no opinion.
"""

from __future__ import annotations

from typing import Any

from ..conf import settings

APP_LABEL = "keyed_queue"


class KeyedQueueRouter:
    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        return settings.DATABASE if model._meta.app_label == APP_LABEL else None

    db_for_write = db_for_read

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool | None:
        return None

    def allow_migrate(self, db: str, app_label: str, model_name: str | None = None, **hints: Any) -> bool | None:
        database: str | None = settings.DATABASE
        if app_label != APP_LABEL or not database:
            return None
        return db == database
