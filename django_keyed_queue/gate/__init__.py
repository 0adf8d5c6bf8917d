"""The per-key FIFO permission gate. Pure Redis: never imports Django or Celery."""

from .gate import FinishResult, Gate, Grant, Lease, StartResult, SubmitResult
from .keys import MAX_KEY_LENGTH, KeyNames
from .scripts import Code

__all__ = [
    "MAX_KEY_LENGTH",
    "Code",
    "FinishResult",
    "Gate",
    "Grant",
    "Lease",
    "KeyNames",
    "StartResult",
    "SubmitResult",
]
