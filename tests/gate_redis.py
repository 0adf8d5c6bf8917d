"""The gate's Redis as the tests reach it: which Redis (one server, or a local Redis Cluster with
``KEYED_QUEUE_TESTS_GATE_REDIS=cluster``), which database, and the gate's state read or set in it
(key names, index scores, stored messages, holders). Used by the gate, django and browser tiers and the
root conftest."""

from __future__ import annotations

import os

import redis
from redis.cluster import RedisCluster

from django_keyed_queue.gate import Gate, Holder
from django_keyed_queue.gate.clients import connect
from django_keyed_queue.gate.keys import CLUSTER_INDEX_SHARDS, DEADLINE_INDEX, UNWRITTEN_INDEX, Index, KeyNames

#: The gate and django tiers run with the gate on a local Redis Cluster instead of one server (``make topologies``).
ON_CLUSTER = os.environ.get("KEYED_QUEUE_TESTS_GATE_REDIS") == "cluster"

#: The gate database of the tiers without workers. The session's workers, once a test started them,
#: reap database 0 every few seconds; on these tiers' keys they would act before the test does.
WORKERLESS_GATE_DB = 4

#: The indexes as the gate of the tier's Redis splits them.
DEADLINES = Index(DEADLINE_INDEX, CLUSTER_INDEX_SHARDS if ON_CLUSTER else 1)
UNWRITTEN = Index(UNWRITTEN_INDEX, CLUSTER_INDEX_SHARDS if ON_CLUSTER else 1)


def connect_to(url: str) -> redis.Redis | RedisCluster:
    """A client of the tier's Redis, for threads and processes of a test; close it with ``gate.clients.close``,
    which closes a cluster client's node pools too (left open, they warn when collected, in a later test)."""
    return connect(url, cluster=ON_CLUSTER)


def redis_names(client: redis.Redis) -> set[str]:
    """Every key name in the gate database but the shared deadline index (tests of the reaper check that)."""
    return {name.decode() for name in client.scan_iter(count=1000)} - set(DEADLINES.names)


def index_scores(client: redis.Redis, index: Index) -> dict[str, float]:
    """Every key of ``index`` with its score, over all its shards."""
    return {m.decode(): s for name in index.names for m, s in client.zrange(name, 0, -1, withscores=True)}


def set_index_scores(client: redis.Redis, index: Index, scores: dict[str, float], **options) -> None:
    """``ZADD`` each key's score into its shard of ``index``."""
    for key, score in scores.items():
        client.zadd(index.shard_of(key), {key: score}, **options)


def evalsha_calls(client: redis.Redis) -> int:
    """How many EVALSHA commands the tier's Redis ran so far, over every master of a cluster."""
    if isinstance(client, RedisCluster):
        stats = client.info("commandstats", target_nodes=RedisCluster.PRIMARIES).values()
    else:
        stats = [client.info("commandstats")]
    return sum(s.get("cmdstat_evalsha", {}).get("calls", 0) for s in stats)


def message_of(client: redis.Redis, key: str, ticket: int) -> bytes | None:
    return client.hget(KeyNames(key).messages, ticket)


def holder(gate: Gate, key: str, ticket: int) -> Holder:
    return gate.inspect(key).holders[ticket]
