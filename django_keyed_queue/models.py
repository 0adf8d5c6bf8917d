"""Django loads an app's models from ``<app>.models``: they live in ``records``."""

from .records.models import IdempotencyKey, KeyedTask, KeyWord, LiveKey

__all__ = ["IdempotencyKey", "KeyedTask", "KeyWord", "LiveKey"]
