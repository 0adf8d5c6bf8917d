"""Keyed serial execution for Celery tasks in Django projects.

The public API: the decorator and the task base class, the exceptions, the
operator's actions (the admin's and the commands' own code) and the health view.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

from .exceptions import (
    ActionRefused,
    GateUnavailable,
    IdempotencyConflict,
    InvalidArguments,
    InvalidKey,
    KeyedQueueError,
    KeyQueueFull,
    UnencodableArguments,
)

if TYPE_CHECKING:
    from .ops.explain import explain
    from .ops.recovery import cancel, pause, reap, rebuild, release, resume, retry
    from .ops.views import health
    from .worker.decorators import keyed_serial_task
    from .worker.task import KeyedSerialTask

__all__ = [
    "ActionRefused",
    "GateUnavailable",
    "IdempotencyConflict",
    "InvalidArguments",
    "InvalidKey",
    "KeyedQueueError",
    "KeyQueueFull",
    "KeyedSerialTask",
    "UnencodableArguments",
    "cancel",
    "explain",
    "health",
    "keyed_serial_task",
    "pause",
    "reap",
    "rebuild",
    "release",
    "resume",
    "retry",
]

#: Loaded on first use, after Django's apps: they import the models.
_LAZY = {
    "keyed_serial_task": ".worker.decorators",
    "KeyedSerialTask": ".worker.task",
    "health": ".ops.views",
    "explain": ".ops.explain",
    **{name: ".ops.recovery" for name in ("cancel", "pause", "reap", "rebuild", "release", "resume", "retry")},
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
