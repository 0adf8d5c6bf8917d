"""Bodies of the concurrent submitters and workers of test_races.

Not a test module: spawned processes import it by name, so it imports nothing but redis and the gate.
Threads and processes run the same code; each opens its own Redis client, and they meet through
Redis lists: READY (each one says it is up), GO (the start signal), WORK (granted tickets to run),
LOG (what happened, in Redis' one total order) and ERRORS.
"""

from __future__ import annotations

import time
import traceback

import redis

from django_keyed_queue.gate import Finish, Gate, Grant, Lease, Start, Submission
from django_keyed_queue.gate.clients import close
from tests.gate_redis import connect_to

READY = "test:ready"
GO = "test:go"
SUBMITTED = "test:submitted"
WORK = "test:work"
LOG = "test:log"
DONE = "test:done"
ERRORS = "test:errors"
STOP = b"stop"


def make_gate(client: redis.Redis) -> Gate:
    return Gate(client, lease_seconds=30, dispatch_timeout_seconds=60, idle_horizon_seconds=3600)


def submitter(url: str, key: str, name: str, count: int, limit: int) -> None:
    """Submit ``count`` tasks as soon as GO says so; record ``ticket|granted|message`` for each."""
    client = connect_to(url)
    try:
        gate = make_gate(client)
        client.rpush(READY, name)
        if client.blpop([GO], timeout=20) is None:
            raise RuntimeError("no start signal within 20 s")
        for i in range(count):
            message = f"{name}/{i}"
            result = gate.submit(Submission(key, message.encode(), limit=limit))
            client.rpush(SUBMITTED, f"{result.ticket}|{int(result.granted)}|{message}")
    except Exception:
        client.rpush(ERRORS, f"{name}: {traceback.format_exc()}")
        raise
    finally:
        close(client)  # a cluster client's node pools too


def publish(client: redis.Redis, grants: list[Grant]) -> None:
    """Hand granted tickets to the workers; each is delivered twice, as a broker may redeliver."""
    for grant in grants:
        item = f"{grant.ticket}:{grant.dispatch}"
        client.rpush(WORK, item, item)


def worker(url: str, key: str, name: str, limit: int, total: int, stops: int, work_seconds: float) -> None:
    """Run granted tickets from WORK until a stop item; every fifth ticket retries once.

    Logs ``start``/``end``/``retry`` lines to LOG: a start is logged after the gate's start and
    an end before the gate's finish, so the logged runs lie inside the gate's holds.
    """
    client = connect_to(url)
    try:
        gate = make_gate(client)
        client.rpush(READY, name)
        while True:
            item = client.blpop([WORK], timeout=20)
            if item is None:
                raise RuntimeError("no work within 20 s")
            if item[1] == STOP:
                return
            ticket, dispatch = (int(part) for part in item[1].split(b":"))
            started = gate.start(Start(key, ticket, dispatch))
            if not started.ok:
                client.rpush(LOG, f"drop {ticket} {name} {started.code.name}")
                continue
            client.rpush(LOG, f"start {ticket} {name} {started.attempts}")
            time.sleep(work_seconds)  # the task's work, so that runs have a length
            if ticket % 5 == 0 and started.attempts == 1:
                client.rpush(LOG, f"retry {ticket} {name}")
                new_dispatch = gate.retry(Lease(key, ticket, started.token), b"retry", countdown_seconds=0)
                if new_dispatch is None:
                    raise RuntimeError(f"retry of {ticket} was fenced")
                # The retry's message, and a late redelivery of the old one (must be dropped).
                client.rpush(WORK, f"{ticket}:{dispatch}", f"{ticket}:{new_dispatch}")
                continue
            client.rpush(LOG, f"end {ticket} {name}")
            done = gate.finish(Finish(key, ticket, started.token, limit=limit))
            if not done.ok:
                raise RuntimeError(f"finish of {ticket} returned {done.code.name}")
            publish(client, done.granted)
            if client.incr(DONE) == total:
                client.rpush(WORK, *[STOP] * stops)
    except Exception:
        client.rpush(ERRORS, f"{name}: {traceback.format_exc()}")
        raise
    finally:
        close(client)  # a cluster client's node pools too
