"""Closing the clients of the tests' Redis servers before the servers stop."""

from __future__ import annotations

import gc

import redis
from celery.backends.redis import ResultConsumer


def disconnect_clients(ports: set[int | None]) -> None:
    """Close every client connection to the test Redis servers on ``ports`` while they still answer.

    Celery's result backends (one per thread that submitted) subscribe per result,
    and an AsyncResult unsubscribes when collected; kombu's channels and the
    tests' clients keep sockets open. Collected after the server stopped, they
    would write to it or warn of open sockets, failing the run at random.
    """
    for obj in gc.get_objects():
        if isinstance(obj, ResultConsumer):
            obj.subscribed_to.clear()
        elif isinstance(obj, redis.ConnectionPool) and obj.connection_kwargs.get("port") in ports:
            obj.disconnect()
    gc.collect()
