"""How a gate call outlasts a Redis restart or failover, and a lost reply: one policy for every caller.

A worker's calls are made after the fact (start, finish, retry): giving up
would leave a key held until its lease expires, so they wait a restart out
(``outlast_restart``). A call whose reply was lost may have run: ``asked_again``
asks again in a form the gate answers the same either way (``retried=True``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import partial
from typing import TypeVar

import redis

from ..exceptions import GateUnavailable
from ..gate import NotSent, Submission, SubmitResult
from ..gate.views import ProducerGate

logger = logging.getLogger(__name__)
T = TypeVar("T")

#: Errors of a Redis that is restarting or failing over: worth waiting out on a worker.
TRANSIENT = (redis.ConnectionError, redis.TimeoutError, redis.exceptions.BusyLoadingError)

#: How long a producer whose submission lost its reply keeps asking the gate before it fails.
SUBMIT_RETRY_SECONDS = 5.0


def outlast_restart(call: Callable[[], T], *, seconds: float = 15.0) -> tuple[T, bool]:
    """Run a gate call, retrying while Redis restarts; returns its result and whether it was retried.

    Only for calls a worker makes after the fact (start, finish, retry), where
    giving up would leave a key held until its lease expires. A retried call
    may have run once already (the reply was lost): callers read the result
    knowing that.
    """
    deadline = time.monotonic() + seconds
    delay, retried = 0.05, False
    while True:
        try:
            return call(), retried
        except TRANSIENT as exc:
            if time.monotonic() + delay > deadline:
                raise
            logger.warning("the keyed queue's Redis is unreachable (%s); trying again in %.2fs", exc, delay)
            time.sleep(delay)
            # Short steps: a restarted Redis is back within a second or two, and every late
            # finish brings its lease nearer to expiring.
            delay, retried = min(delay * 2, 0.25), True


def asked_again(call: Callable[..., T], what: str, *, wait_out_outage: bool = False) -> T:
    """``call()``; if its reply was lost, ``call(retried=True)`` until Redis answers.

    A producer (the default) fails at once when Redis is down (``NotSent``: nothing
    was taken) and asks again for ``SUBMIT_RETRY_SECONDS``; a worker
    (``wait_out_outage``) waits out a restart, as for every call after the fact.
    """
    try:
        return call()
    except NotSent:
        if not wait_out_outage:
            raise  # Redis is down: nothing was taken, fail at once
    except TRANSIENT:
        logger.warning("%s lost its reply; asking the gate again", what)
    seconds = {} if wait_out_outage else {"seconds": SUBMIT_RETRY_SECONDS}
    try:
        return outlast_restart(partial(call, retried=True), **seconds)[0]
    except redis.RedisError as exc:
        if wait_out_outage:
            raise
        raise GateUnavailable(
            f"{what}: the keyed queue's Redis went away during the submission, which may have "
            f"been queued and may still run: {exc}"
        ) from exc


def take_ticket(
    gate: ProducerGate, task_name: str, submission: Submission, *, wait_out_outage: bool = False
) -> SubmitResult | None:
    """Take a ticket for ``submission``: a producer's, or a delayed task's join.

    A reply lost with the connection may hide a ticket taken: the gate is asked
    again (``asked_again``), and returns the ticket this message holds.
    """
    call = partial(gate.submit, submission)
    what = f"{task_name}: submitting to key={submission.key!r}"
    return asked_again(call, what, wait_out_outage=wait_out_outage)
