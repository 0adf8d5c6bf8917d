"""Keyed serial execution for Celery tasks in Django projects.

The public API: the decorator and the task base class, the exceptions, the
operator's actions (the admin's and the commands' own code), the health and metrics views and
``get_gate()``, this process's gate client.
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
    from .keyed_task.decorators import keyed_serial_task, pooled_task
    from .keyed_task.task import KeyedSerialTask
    from .ops.explain import explain
    from .ops.limits import set_key_limit, set_key_rate, set_pool_limit, set_pool_rate
    from .ops.metrics import metrics
    from .ops.rebuild import rebuild
    from .ops.recovery import cancel, pause, reap, release, resume, retry
    from .ops.run_now import run_now
    from .ops.stop import stop
    from .ops.views import health
    from .process.state import get_gate

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
    "get_gate",
    "health",
    "keyed_serial_task",
    "metrics",
    "pause",
    "pooled_task",
    "reap",
    "rebuild",
    "release",
    "resume",
    "retry",
    "run_now",
    "set_key_limit",
    "set_key_rate",
    "set_pool_limit",
    "set_pool_rate",
    "stop",
]

#: Loaded on first use, after Django's apps: they import the models.
_LAZY = {
    "keyed_serial_task": ".keyed_task.decorators",
    "pooled_task": ".keyed_task.decorators",
    "KeyedSerialTask": ".keyed_task.task",
    "health": ".ops.views",
    "metrics": ".ops.metrics",
    "get_gate": ".process.state",
    "explain": ".ops.explain",
    "set_key_limit": ".ops.limits",
    "set_key_rate": ".ops.limits",
    "set_pool_limit": ".ops.limits",
    "set_pool_rate": ".ops.limits",
    "rebuild": ".ops.rebuild",
    "run_now": ".ops.run_now",
    "stop": ".ops.stop",
    **{name: ".ops.recovery" for name in ("cancel", "pause", "reap", "release", "resume", "retry")},
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
