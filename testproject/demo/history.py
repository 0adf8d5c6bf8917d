"""A shared, totally ordered log of task starts and ends, kept in Redis.

Tests and benchmarks read it back to check order and exclusion: RPUSH order
is the order events happened, with no clocks to compare across processes.
"""

from __future__ import annotations

import json
import os
import time
from functools import cache

import redis
from django.conf import settings
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

HISTORY = "testproject:history"


@cache
def _client(pid: int) -> redis.Redis:
    # Crash tests restart this Redis under running tasks: wait it out rather than fail the task.
    return redis.Redis.from_url(
        settings.CELERY_BROKER_URL.rsplit("/", 1)[0] + "/3",
        retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), 30),
        retry_on_error=[redis.ConnectionError, redis.TimeoutError, redis.exceptions.BusyLoadingError],
    )


def client() -> redis.Redis:
    return _client(os.getpid())


def log(event: str, key: str, n: int, **extra: object) -> None:
    entry = {"event": event, "key": key, "n": n, "pid": os.getpid(), "t": time.time(), **extra}
    client().rpush(HISTORY, json.dumps(entry))


def read() -> list[dict]:
    return [json.loads(raw) for raw in client().lrange(HISTORY, 0, -1)]


def clear() -> None:
    client().delete(HISTORY)


#: Keys whose ``ledger_entry`` fails while they are in this set (a test's switch).
FAILING = "testproject:failing"


def tell_to_fail(key: str, fail: bool = True) -> None:
    if fail:
        client().sadd(FAILING, key)
    else:
        client().srem(FAILING, key)


def told_to_fail(key: str) -> bool:
    return bool(client().sismember(FAILING, key))
