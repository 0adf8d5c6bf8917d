"""Small helpers shared by the gate tests (not a test module)."""

from __future__ import annotations

import redis

from django_keyed_queue.gate import Gate, Holder
from django_keyed_queue.gate.keys import DEADLINE_INDEX, KeyNames


def redis_names(client: redis.Redis) -> set[str]:
    """Every key name in the gate database but the shared deadline index (tests of the reaper check that)."""
    return {name.decode() for name in client.scan_iter(count=1000)} - {DEADLINE_INDEX}


def message_of(client: redis.Redis, key: str, ticket: int) -> bytes | None:
    return client.hget(KeyNames(key).messages, ticket)


def holder(gate: Gate, key: str, ticket: int) -> Holder:
    return gate.inspect(key).holders[ticket]
