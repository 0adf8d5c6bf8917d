"""Keyed serial execution for Celery tasks in Django projects."""

from typing import TYPE_CHECKING, Any

from .exceptions import (
    GateUnavailable,
    IdempotencyConflict,
    InvalidArguments,
    InvalidKey,
    KeyedQueueError,
    KeyQueueFull,
)

if TYPE_CHECKING:
    from .decorators import keyed_serial_task
    from .task import KeyedSerialTask

__all__ = [
    "GateUnavailable",
    "IdempotencyConflict",
    "InvalidArguments",
    "InvalidKey",
    "KeyedQueueError",
    "KeyQueueFull",
    "KeyedSerialTask",
    "keyed_serial_task",
]


def __getattr__(name: str) -> Any:
    # The task layer imports the models, so it loads on first use, after Django's apps.
    if name == "keyed_serial_task":
        from .decorators import keyed_serial_task

        return keyed_serial_task
    if name == "KeyedSerialTask":
        from .task import KeyedSerialTask

        return KeyedSerialTask
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
