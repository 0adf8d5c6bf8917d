"""The per-key FIFO permission gate. Pure Redis: never imports Django or Celery.

``Gate`` is its one client (gate.py says which module holds which of its concerns);
``keys`` names every Redis key it uses; ``calls`` builds every script's arguments.
"""

from .cancel import Cancel
from .finish import Finish
from .gate import Gate, NotSent, ReplicasBehind
from .keys import MAX_KEY_LENGTH
from .override import UNCHANGED
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
    RestoredAhead,
    StartResult,
    Stopping,
    SubmitResult,
    Unwritten,
    UnwrittenRecords,
)
from .scripts import Code
from .start import Start
from .submit import Submission

__all__ = [
    "MAX_KEY_LENGTH",
    "UNCHANGED",
    "Cancel",
    "Code",
    "Finish",
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
    "RestoredAhead",
    "Start",
    "StartResult",
    "Stopping",
    "Submission",
    "SubmitResult",
    "Unwritten",
    "UnwrittenRecords",
]
