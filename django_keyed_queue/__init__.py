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
    from .ops.actions.limits import set_limits as set_limits
    from .ops.actions.rebuild import rebuild as rebuild
    from .ops.actions.recovery import cancel as cancel
    from .ops.actions.recovery import pause as pause
    from .ops.actions.recovery import reap as reap
    from .ops.actions.recovery import release as release
    from .ops.actions.recovery import resume as resume
    from .ops.actions.recovery import retry as retry
    from .ops.actions.run_now import run_now as run_now
    from .ops.actions.stop import stop as stop
    from .ops.console.explain import explain as explain
    from .ops.console.metrics import metrics as metrics
    from .ops.console.views import health as health

#: The names loaded on first use, after Django's apps (they import the models), by module.
_LAZY = {
    **dict.fromkeys(("keyed_serial_task", "pooled_task"), ".keyed_task.decorators"),
    "KeyedSerialTask": ".keyed_task.task",
    "explain": ".ops.console.explain",
    "set_limits": ".ops.actions.limits",
    "metrics": ".ops.console.metrics",
    "rebuild": ".ops.actions.rebuild",
    **dict.fromkeys(("cancel", "pause", "reap", "release", "resume", "retry"), ".ops.actions.recovery"),
    "run_now": ".ops.actions.run_now",
    "stop": ".ops.actions.stop",
    "health": ".ops.console.views",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
