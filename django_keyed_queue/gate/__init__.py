"""The per-key FIFO permission gate. Pure Redis: never imports Django or Celery."""

from .gate import Gate, NotSent
from .keys import DEADLINE_INDEX, MAX_KEY_LENGTH, PAUSED_KEYS, KeyNames
from .results import FinishResult, Grant, Lease, QueueFull, Recovery, StartResult, SubmitResult
from .scripts import Code

__all__ = [
    "DEADLINE_INDEX",
    "PAUSED_KEYS",
    "MAX_KEY_LENGTH",
    "Code",
    "FinishResult",
    "Gate",
    "Grant",
    "Lease",
    "Recovery",
    "KeyNames",
    "NotSent",
    "QueueFull",
    "StartResult",
    "SubmitResult",
]
