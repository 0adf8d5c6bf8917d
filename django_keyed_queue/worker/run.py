"""A run: one attempt of a keyed task in a worker process, from taking its slot to ending it.

``Run.begin`` starts the ticket its message names (or, for a delayed task now
due, takes one), ``finish`` ends it at the gate and dispatches what that
grants, and ``retry_in_place`` keeps the slot through ``self.retry()`` (an
attempt Celery kills ends in ``killed``). Each concern has its module:
``run_start``, ``run_end``, ``run_retry``, and ``run_base`` for what they share.
"""

from __future__ import annotations

from .run_end import RunEnd
from .run_retry import RunRetry
from .run_start import RunStart


class Run(RunStart, RunEnd, RunRetry):
    """One attempt of a keyed task: begun with ``Run.begin``, ended with ``succeed``, ``fail``,
    ``reject`` or ``finish``, or handed to its retry with ``retry_in_place``."""
