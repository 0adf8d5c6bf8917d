"""Queries over keyed task records."""

from __future__ import annotations

from django.db import models

from .statuses import ACTIVE_STATUSES


class KeyedTaskQuerySet(models.QuerySet):
    def active(self) -> KeyedTaskQuerySet:
        return self.filter(status__in=ACTIVE_STATUSES)

    def for_key(self, key: str) -> KeyedTaskQuerySet:
        return self.filter(key=key)
