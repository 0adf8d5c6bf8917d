"""The per-key FIFO permission gate. Pure Redis: never imports Django or Celery.

``Gate`` is its one client; ``keys`` names every Redis key it uses.
"""

from .gate import Gate, NotSent
from .keys import MAX_KEY_LENGTH
from .results import FinishResult, Grant, Lease, QueueFull, Recovery, StartResult, SubmitResult
from .scripts import Code

__all__ = [
    "MAX_KEY_LENGTH",
    "Code",
    "FinishResult",
    "Gate",
    "Grant",
    "Lease",
    "NotSent",
    "QueueFull",
    "Recovery",
    "StartResult",
    "SubmitResult",
]
