"""The per-key FIFO permission gate. Pure Redis: never imports Django or Celery.

``Gate`` is its one client (gate.py says which module holds which of its concerns);
``keys`` names every Redis key it uses; ``calls`` builds every script's arguments.
"""

from .gate import Gate, NotSent, ReplicasBehind
from .keys import MAX_KEY_LENGTH
from .operator import UNCHANGED
from .pools import Pool, PoolAcquired
from .results import (
    FinishResult,
    Grant,
    Holder,
    HolderState,
    KeptStart,
    KeySnapshot,
    Lease,
    Outcome,
    Overridden,
    QueueFull,
    Recovery,
    RecoveryAction,
    StartResult,
    Stopping,
    Submission,
    SubmitResult,
    Unwritten,
    UnwrittenRecords,
)
from .scripts import Code

__all__ = [
    "MAX_KEY_LENGTH",
    "UNCHANGED",
    "Code",
    "FinishResult",
    "Gate",
    "Grant",
    "Holder",
    "Overridden",
    "HolderState",
    "KeptStart",
    "KeySnapshot",
    "Lease",
    "NotSent",
    "Outcome",
    "Pool",
    "PoolAcquired",
    "QueueFull",
    "Recovery",
    "RecoveryAction",
    "ReplicasBehind",
    "StartResult",
    "Stopping",
    "Submission",
    "SubmitResult",
    "Unwritten",
    "UnwrittenRecords",
]
