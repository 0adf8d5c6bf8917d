"""Keyed serial execution for Celery tasks in Django projects.

The public API: the decorator and the task base class, the exceptions, the operator's actions (the
admin's and the commands' own code), and the health and metrics views.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

from .exceptions import ActionRefused as ActionRefused
from .exceptions import GateUnavailable as GateUnavailable
from .exceptions import IdempotencyConflict as IdempotencyConflict
from .exceptions import InvalidArguments as InvalidArguments
from .exceptions import InvalidKey as InvalidKey
from .exceptions import KeyedQueueError as KeyedQueueError
from .exceptions import KeyQueueFull as KeyQueueFull
from .exceptions import UnencodableArguments as UnencodableArguments

if TYPE_CHECKING:  # for type checkers (explicit re-exports): at run time each is loaded on first use, from _LAZY
    from .keyed_task.decorators import keyed_serial_task as keyed_serial_task
    from .keyed_task.decorators import pooled_task as pooled_task
    from .keyed_task.task import KeyedSerialTask as KeyedSerialTask
    from .ops.explain import explain as explain
    from .ops.limits import set_limits as set_limits
    from .ops.metrics import metrics as metrics
    from .ops.rebuild import rebuild as rebuild
    from .ops.recovery import cancel as cancel
    from .ops.recovery import pause as pause
    from .ops.recovery import reap as reap
    from .ops.recovery import release as release
    from .ops.recovery import resume as resume
    from .ops.recovery import retry as retry
    from .ops.run_now import run_now as run_now
    from .ops.stop import stop as stop
    from .ops.views import health as health

#: The names loaded on first use, after Django's apps (they import the models), by module.
_LAZY = {
    **dict.fromkeys(("keyed_serial_task", "pooled_task"), ".keyed_task.decorators"),
    "KeyedSerialTask": ".keyed_task.task",
    "explain": ".ops.explain",
    "set_limits": ".ops.limits",
    "metrics": ".ops.metrics",
    "rebuild": ".ops.rebuild",
    **dict.fromkeys(("cancel", "pause", "reap", "release", "resume", "retry"), ".ops.recovery"),
    "run_now": ".ops.run_now",
    "stop": ".ops.stop",
    "health": ".ops.views",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
