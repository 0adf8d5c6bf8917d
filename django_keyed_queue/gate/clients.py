"""The gate's Redis client for a URL: one server, a Redis Cluster, or the master Sentinel names."""

from __future__ import annotations

from typing import Any, cast
from urllib.parse import unquote, urlsplit

import redis
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException
from redis.sentinel import Sentinel

from .transport import NotSent

SENTINEL_SCHEME = "sentinel"


def connect(
    url: str, *, cluster: bool = False, sentinel_master: str | None = None, **options: Any
) -> redis.Redis | RedisCluster:
    """A client of the gate's Redis at ``url``.

    ``cluster``: ``url`` names any node of a Redis Cluster; the client finds the rest.
    A ``sentinel://host:port;sentinel://host2:port`` URL, as Celery's broker URL for Sentinel
    reads, with ``sentinel_master`` naming the monitored master: the client asks the
    sentinels where the master is, and again after a failover. ``options`` go to each
    connection (timeouts, for example).
    """
    if is_sentinel_url(url):
        if not sentinel_master:
            raise ValueError(f"a Sentinel URL needs the name of its master, got none for {url!r}")
        if cluster:
            raise ValueError("a Sentinel URL names no Redis Cluster")
        return sentinel_client(url, sentinel_master, **options)
    if cluster:
        try:
            return RedisCluster.from_url(url, **options)  # asks the node for the others at once
        except RedisClusterException as exc:  # no RedisError: as the gate's callers expect it
            raise NotSent(f"the Redis Cluster cannot be reached: {exc}") from exc
    return redis.Redis.from_url(url, **options)


def close(client: redis.Redis | RedisCluster) -> None:
    """Close ``client`` and its sockets. A cluster client made from a URL gives each node a pool
    that its ``close()`` leaves open (redis-py): those are disconnected here, not left to the GC."""
    client.close()
    if isinstance(client, RedisCluster):
        for node in client.get_nodes():  # type: ignore[no-untyped-call]
            if node.redis_connection is not None:
                node.redis_connection.connection_pool.disconnect()


def is_sentinel_url(url: str) -> bool:
    return url.split(":", 1)[0].lower() == SENTINEL_SCHEME


def sentinel_client(url: str, master: str, **options: Any) -> redis.Redis:
    """The client of ``master`` as the sentinels of ``url`` report it.

    Each ``;``-separated part names one sentinel. A user name, password and database
    number, in the first part that has them, are the master's, as kombu reads them.
    """
    parts = [urlsplit(part.strip()) for part in url.split(";") if part.strip()]
    hosts = [(part.hostname or "localhost", part.port or 26379) for part in parts]
    credentials = next((part for part in parts if part.password or part.username), None)
    database = next((part.path.strip("/") for part in parts if part.path.strip("/")), "0")
    if not (database.isascii() and database.isdigit()):
        raise ValueError(f"a Sentinel URL's database must be a number, got {database!r} in {url!r}")
    master_options = dict(options)
    if credentials is not None:
        master_options["username"] = unquote(credentials.username) if credentials.username else None
        master_options["password"] = unquote(credentials.password) if credentials.password else None
    # Through Any: redis-py annotates Sentinel in some versions and not in others (8.1 does not, 8.2 does).
    sentinels = cast(Any, Sentinel)(hosts, sentinel_kwargs=_sentinel_options(options))
    client: redis.Redis = sentinels.master_for(master, db=int(database), **master_options)
    return client


def _sentinel_options(options: dict[str, Any]) -> dict[str, Any]:
    """The connection options that also fit the sentinels (their timeouts): never the master's password."""
    return {name: value for name, value in options.items() if name in ("socket_timeout", "socket_connect_timeout")}


__all__ = ["close", "connect", "is_sentinel_url", "sentinel_client"]
