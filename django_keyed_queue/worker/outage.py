"""What a worker does while the gate's Redis restarts or fails over: one policy for every call after the fact."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

import redis

logger = logging.getLogger(__name__)
T = TypeVar("T")

#: Errors of a Redis that is restarting or failing over: worth waiting out on a worker.
TRANSIENT = (redis.ConnectionError, redis.TimeoutError, redis.exceptions.BusyLoadingError)


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
