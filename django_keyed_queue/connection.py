"""The gate of this process, made on first use and never shared across a fork."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import redis

from .conf import settings
from .gate import Gate

logger = logging.getLogger(__name__)
T = TypeVar("T")
_lock = threading.Lock()
_gate: Gate | None = None
_pid: int | None = None


def get_gate() -> Gate:
    global _gate, _pid
    with _lock:
        if _gate is None or _pid != os.getpid():
            client = redis.Redis.from_url(
                settings.REDIS_URL,
                socket_connect_timeout=5,
                socket_timeout=30,
                health_check_interval=30,
            )
            _gate = Gate(
                client,
                lease_seconds=settings.LEASE_SECONDS,
                dispatch_timeout_seconds=settings.DISPATCH_TIMEOUT_SECONDS,
                idle_horizon_seconds=settings.IDLE_HORIZON_SECONDS,
            )
            _pid = os.getpid()
        return _gate


def reset_gate(**_: object) -> None:
    """Drop this process's client (after a fork, or when settings change)."""
    global _gate
    with _lock:
        if _gate is not None and _pid == os.getpid():
            _gate.client.close()
        _gate = None


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
        except TRANSIENT:
            if time.monotonic() + delay > deadline:
                raise
            logger.warning("the keyed queue's Redis is unreachable; trying again in %.2fs", delay)
            time.sleep(delay)
            # Short steps: a restarted Redis is back within a second or two, and every late
            # finish brings its lease nearer to expiring.
            delay, retried = min(delay * 2, 0.25), True
