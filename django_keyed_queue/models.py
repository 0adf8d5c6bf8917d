"""Django loads an app's models from ``<app>.models``: they live in ``records``."""

from .records.models import IdempotencyKey, KeyedTask, LiveKey

__all__ = ["IdempotencyKey", "KeyedTask", "LiveKey"]
