"""What every part of a run shares: its task, lease and attempt, and the checks and notes any part makes.

A run (``run.Run``) is read by concern, one module each: its start (``run_start``), its end
(``run_end``) and its retry (``run_retry``); its handoff of the next task is ``handoff``'s.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, cast

import redis

from ..exceptions import InvalidArguments, InvalidKey
from ..gate import Lease
from ..messaging.dispatch import publish_grants
from ..messaging.message import DELAY_OPTIONS
from ..process.outage import outlast_restart
from ..process.state import current
from ..records.columns import shown
from ..records.transitions import Transition

if TYPE_CHECKING:
    from celery.app.task import Context

    from ..messaging.task_type import KeyedTaskProtocol


logger = logging.getLogger(__name__)

#: How long ``Run.superseded`` answers from what it last read: a task may ask in a tight loop.
SUPERSEDED_READ_SECONDS = 0.1


class RunBase:
    """A run's task, lease and attempt, and what its start, end and retry each read or note."""

    def __init__(self, task: KeyedTaskProtocol, lease: Lease, attempts: int) -> None:
        self.task = task
        self.lease = lease
        self.attempts = attempts
        #: ``self.retry()`` handed the slot to the retry: this attempt's end finishes nothing.
        self.retried = False
        self._superseded, self._superseded_read_at = False, -SUPERSEDED_READ_SECONDS
        self._began = time.monotonic()

    def check_key(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Raise ``InvalidKey`` if the arguments this run received make another key than its ticket's: the
        task's key function read something besides them, or an argument changed form in the message."""
        drift = key_drift(self.task, self.lease.key, args, kwargs)
        if drift is not None:
            raise drift

    def _transition(self, status: str, **fields: Any) -> Transition:
        """This attempt's record moving to ``status``."""
        request_id = self.task.request.id
        return Transition(cast(str, request_id), self.lease.key, self.lease.ticket, status, self.attempts, fields)

    def holds_key(self) -> bool:
        """True while the lease was not lost (one round trip)."""
        process = current()
        if process.leases.is_lost(self.lease):
            return False
        return outlast_restart(lambda: process.gate.holds(self.lease))[0]

    def superseded(self) -> bool:
        """Whether a newer submission of this coalescing task waits behind this run: read from the gate
        at most every ``SUPERSEDED_READ_SECONDS``, and True for good once it was. False while Redis is
        out of reach (a hint: the run goes on)."""
        now = time.monotonic()
        if self._superseded or now - self._superseded_read_at < SUPERSEDED_READ_SECONDS:
            return self._superseded
        self._superseded_read_at = now
        try:
            self._superseded = current().gate.newer_waiting(self.lease.key, self.task.name, self.lease.ticket)
        except redis.RedisError:
            logger.debug("%s key=%r: whether it was superseded is not known", self.task.name, self.lease.key)
        return self._superseded

    def give_back_pool_slot(self) -> None:
        """The run's slot of its pool goes back, and the next waiting ticket takes it: once its key heard
        of its end (so no later message of the ticket starts) and before a retry of it goes out."""
        if self.task.serial_pool is not None:
            give_back(self.task, self.task.serial_pool, self.lease.key, self.lease.ticket)

    def let_go(self) -> None:
        """Stop renewing the lease without ending the run: a retry went out, or the process is going down."""
        current().leases.stop_renewing(self.lease)

    def _count_end(self, outcome: str) -> None:
        totals = current().totals
        totals.count("finished", self.task, outcome=outcome)
        totals.observe("run_seconds", self.task, time.monotonic() - self._began, outcome=outcome)


def give_back(task: KeyedTaskProtocol, pool: str, key: str, ticket: int) -> None:
    """Give ``ticket``'s slot of ``pool`` back and publish the ticket that takes it. If Redis cannot be
    reached, the slot returns by the end of its hold (a lease, and a margin)."""
    gate = current().gate
    try:
        granted, _ = outlast_restart(lambda: gate.pool_release(pool, [(key, ticket)]))
    except redis.RedisError:
        logger.warning("giving back the slot of pool %r of key=%r ticket=%s failed; it returns at its lease's end",
                       pool, key, ticket, exc_info=True)  # fmt: skip
        return
    publish_grants(task.app, granted)


def key_drift(task: KeyedTaskProtocol, key: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> InvalidKey | None:
    """The error of a run of ``key`` whose arguments make another key (or none); None if they make ``key``."""
    try:
        made_key = task.key_for(args, kwargs)
    except (InvalidKey, InvalidArguments) as exc:
        made = f"no key ({exc})"
    else:
        if made_key == key:  # every run's case: compared whole, before anything is formatted
            return None
        made = f"key {shown(made_key)}"
    return InvalidKey(
        f"{task.name}: its ticket is of key {shown(key)}, but its arguments as the worker has them make {made}: "
        "a key must be a function of the task's arguments alone (no clock, setting or database row), and of "
        "arguments that keep their form through the message (a tuple arrives as a list, a datetime as text)"
    )


def request_options(request: Context) -> dict[str, Any]:
    """The options a worker's ``request`` was sent with, as ``gate_message`` takes them (no delay: it is due)."""
    options = {k: v for k, v in request.as_execution_options().items() if k not in DELAY_OPTIONS}
    routing = request.delivery_info or {}
    if routing.get("routing_key"):
        options.setdefault("queue", routing["routing_key"])
    return options
