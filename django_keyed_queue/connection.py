"""The gate of this process, made on first use and never shared across a fork."""

from __future__ import annotations

import os
import threading

import redis

from .conf import settings
from .gate import Gate

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
