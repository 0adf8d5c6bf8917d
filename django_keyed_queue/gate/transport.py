"""How the gate sends a round trip of commands: to one server, or across a Redis Cluster.

Both send every command once. A command that may have run is never sent again here:
a lost reply raises, and the caller, who knows whether the call is safe to repeat,
decides. Replies that say a command did not run (``MOVED``, ``ASK``, ``TRYAGAIN``)
are followed on a cluster; ``NOSCRIPT`` is the gate's to handle (it loads the script).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.connection import Connection
from redis.crc import key_slot
from redis.exceptions import AskError, MovedError, RedisClusterException, ResponseError, TryAgainError
from redis.typing import EncodableT

Command = tuple[EncodableT, ...]

#: Redirections (MOVED, ASK) followed for a call before it is given up as not sent.
MAX_REDIRECTIONS = 5
#: How long a call refused while its slot moves (TRYAGAIN) is sent again before it is given up as not sent.
TRYAGAIN_SECONDS = 2.0


class NotSent(redis.ConnectionError):
    """Redis could not be reached before the call was sent: it certainly did not run."""


class ReplicasBehind(redis.TimeoutError):
    """The commands ran, but fewer replicas than required acknowledged them in time: a failover
    now could lose them. Callers treat it as a lost reply (and ask again)."""


class ClusterNotConfigured(ResponseError):
    """A cluster node redirected a command of a client made for one server."""


@dataclass(frozen=True)
class Replication:
    """After each round trip that writes, ``WAIT`` until ``replicas`` replicas have its writes,
    for at most ``timeout_ms``; 0 replicas: no wait (Redis's own asynchronous replication)."""

    replicas: int = 0
    timeout_ms: int = 1000

    def commands(self, commands: Sequence[Command]) -> list[Command]:
        """``commands``, with the ``WAIT`` after them if they write."""
        writes = self.replicas and any(c[0] not in READS for c in commands)
        return [*commands, ("WAIT", self.replicas, self.timeout_ms)] if writes else list(commands)

    def check(self, commands: Sequence[Command], replies: list[Any]) -> list[Any]:
        """The replies of ``commands`` (from :meth:`commands`), the ``WAIT``'s checked and dropped."""
        if not commands or commands[-1][0] != "WAIT":
            return replies
        *replies, acknowledged = replies
        if isinstance(acknowledged, Exception) or int(acknowledged) < self.replicas:
            raise ReplicasBehind(
                f"{acknowledged} of the {self.replicas} replicas required acknowledged the gate's writes"
                f" within {self.timeout_ms} ms"
            )
        return replies


#: The only commands the gate sends here that write nothing.
READS = frozenset({"ZRANGEBYSCORE"})


class ServerTransport:
    """A single server, or the master that Sentinel names: one connection, one write, every reply read.

    The transport holds one connection of its client's pool for its process, used by whichever
    thread finds it free (a child process's task thread, mostly); a thread that finds it in use takes
    one from the pool. Taking a pooled connection and giving it back each call (the pool's locks,
    fork checks and metrics) was about a sixth of a call's client CPU. Before each call the held
    connection is checked as the pool checks one it lends: nothing to read (a server that closed it
    while it was idle), else it connects again, before anything is sent.
    """

    def __init__(self, client: redis.Redis, replication: Replication) -> None:
        self.client = client
        self.replication = replication
        self._holding = threading.Lock()
        self._held: Connection | None = None
        self._held_by = 0  # the process it was taken in: a forked child takes its own

    def round_trip(self, commands: Sequence[Command]) -> list[Any]:
        """Send ``commands`` in one write and read all their replies; error replies are returned.

        What ``pipeline().execute(raise_on_error=False)`` does without the pipeline's per-call
        bookkeeping: a third of the client's time per gate call, and every task makes three.
        """
        sent = self.replication.commands(commands)
        pool = self.client.connection_pool
        if self._holding.acquire(blocking=False):
            try:
                replies = self._on_held(pool, sent)
            finally:
                self._holding.release()
        else:
            replies = _on_connection(pool, sent)
        replies = self.replication.check(sent, replies)
        if redirected := next((r for r in replies if isinstance(r, AskError)), None):  # MOVED too; nothing ran
            raise ClusterNotConfigured(
                f"the gate's Redis is a node of a Redis Cluster, which sent a command elsewhere ({redirected}): "
                "set KEYED_QUEUE_REDIS_CLUSTER = True"
            )
        return replies

    def _on_held(self, pool: redis.ConnectionPool, commands: Sequence[Command]) -> list[Any]:
        conn, pid = self._held, os.getpid()
        if conn is None or self._held_by != pid:  # never a parent's socket
            conn = self._held = _borrowed(pool)
            self._held_by = pid
        try:
            conn.connect()  # at once if connected; after a failed round trip, connects again
            try:
                if conn.can_read():  # the server closed it while it was idle (its ``timeout``), or worse
                    raise redis.ConnectionError("the gate's held connection has data before a call")
            except (redis.ConnectionError, redis.TimeoutError, OSError):
                conn.disconnect()
                conn.connect()
        except (redis.ConnectionError, redis.TimeoutError) as exc:  # nothing was sent
            raise NotSent(str(exc)) from exc
        return _send(conn, commands)


class ClusterTransport:
    """A Redis Cluster: the commands are grouped by the master of their slot, written to every
    master before any reply is read, and each master's replies read in order."""

    def __init__(self, client: RedisCluster, replication: Replication) -> None:
        self.client = client
        self.replication = replication
        self._stale = False

    def round_trip(self, commands: Sequence[Command]) -> list[Any]:
        if self._stale:  # a master was out of reach: a replica may have taken its slots since
            self._refresh(nothing_ran=True)
            self._stale = False
        replies: list[Any] = [None] * len(commands)
        pending = list(range(len(commands)))
        asking: dict[int, ClusterNode] = {}
        redirections, waited, delay = 0, 0.0, 0.05
        while True:
            nothing_ran = len(pending) == len(commands)  # the refused calls did not run
            by_node: dict[str, tuple[ClusterNode, list[int]]] = {}
            for i in pending:
                node = asking.get(i) or self._node_of(commands[i], nothing_ran=nothing_ran)
                by_node.setdefault(node.name, (node, []))[1].append(i)
            batches = [(node, [(i, i in asking) for i in indices]) for node, indices in by_node.values()]
            try:
                self._send(commands, batches, replies, nothing_ran=nothing_ran)
            except (redis.ConnectionError, redis.TimeoutError):
                self._stale = True
                raise
            pending = [i for i in pending if isinstance(replies[i], (AskError, TryAgainError))]  # MOVED is an ASK
            asking = {i: self._node_at(r.host, r.port) for i in pending if type(r := replies[i]) is AskError}
            if not pending:
                return replies
            if any(isinstance(replies[i], TryAgainError) for i in pending):
                # A multi-key call on a slot being moved: refused until the move ends (milliseconds a slot).
                if waited >= TRYAGAIN_SECONDS:
                    break
                time.sleep(delay)
                waited, delay, redirections = waited + delay, min(delay * 2, 0.5), 0
            else:
                redirections += 1
                if redirections > MAX_REDIRECTIONS:
                    break
            if any(isinstance(replies[i], MovedError) for i in pending):
                self._refresh(nothing_ran=len(pending) == len(commands))  # the slots moved: learn where to
        # Those calls never ran. If no script ran either, the caller may know that its call did not:
        # the index hints sent beside the scripts change nothing it relies on.
        scripts = [i for i, command in enumerate(commands) if command[0] == "EVALSHA"] or range(len(commands))
        refused = f"the Redis Cluster kept refusing {len(pending)} of {len(commands)} commands: {replies[pending[0]]}"
        raise _failed(refused, nothing_ran=set(scripts) <= set(pending))

    def _send(
        self,
        commands: Sequence[Command],
        batches: list[tuple[ClusterNode, list[tuple[int, bool]]]],
        replies: list[Any],
        *,
        nothing_ran: bool,
    ) -> None:
        """Write each node's commands (an ``ASKING`` before each asked one, a ``WAIT`` after them if
        replicas must acknowledge), then read every reply."""
        taken: list[tuple[redis.ConnectionPool, Connection]] = []
        try:
            for node, _ in batches:
                pool = self.client.get_redis_connection(node).connection_pool
                try:
                    taken.append((pool, pool.get_connection()))
                except (redis.ConnectionError, redis.TimeoutError) as exc:
                    # Every connection is taken before anything is written: this round sent nothing.
                    raise _failed(str(exc), nothing_ran=nothing_ran) from exc
            written = []
            for (_, conn), (_, batch) in zip(taken, batches, strict=True):
                sent = [c for i, asked in batch for c in ((("ASKING",), commands[i]) if asked else (commands[i],))]
                written.append(self.replication.commands(sent))
                conn.send_packed_command(conn.pack_commands(written[-1]))
            for (_, conn), (_, batch), sent in zip(taken, batches, written, strict=True):
                got = iter(self.replication.check(sent, [_read(conn) for _ in sent]))
                for i, asked in batch:
                    if asked:
                        next(got)  # ASKING's own "OK"
                    replies[i] = next(got)
        except BaseException:
            for _, conn in taken:
                conn.disconnect()  # replies may be left unread: never reuse the connection
            raise
        finally:
            for pool, conn in taken:
                pool.release(conn)

    def _node_of(self, command: Command, *, nothing_ran: bool) -> ClusterNode:
        # EVALSHA sha numkeys key...; every other command the gate sends here names its key first.
        key = command[3] if command[0] == "EVALSHA" else command[1]
        slot = key_slot(key if isinstance(key, bytes) else str(key).encode())
        try:
            return self.client.nodes_manager.get_node_from_slot(slot)
        except RedisClusterException as exc:  # no master serves the slot: the cluster is down
            self._stale = True
            raise _failed(f"the Redis Cluster cannot be reached: {exc}", nothing_ran=nothing_ran) from exc

    def _refresh(self, *, nothing_ran: bool) -> None:
        """Learn the cluster's slots again, from any node that answers."""
        try:
            self.client.nodes_manager.initialize()
        except RedisClusterException as exc:  # not one node answers
            self._stale = True
            raise _failed(f"the Redis Cluster cannot be reached: {exc}", nothing_ran=nothing_ran) from exc

    def _node_at(self, host: str, port: int) -> ClusterNode:
        nodes = self.client.nodes_manager
        node: ClusterNode | None = nodes.get_node(host, port)
        if node is None:
            self._refresh(nothing_ran=False)
            node = nodes.get_node(host, port)
        if node is None:
            raise redis.ConnectionError(f"the cluster redirected a command to an unknown node {host}:{port}")
        return node


def _failed(message: str, *, nothing_ran: bool) -> redis.ConnectionError:
    """A call that failed, as the gate's callers read it: ``NotSent`` if nothing of it ran, else a
    lost reply (it may have run)."""
    return (NotSent if nothing_ran else redis.ConnectionError)(message)


def _borrowed(pool: redis.ConnectionPool) -> Connection:
    """A connection of ``pool``, connected; ``NotSent`` if it cannot be."""
    try:
        return pool.get_connection()  # connects if it must
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise NotSent(str(exc)) from exc


def _on_connection(pool: redis.ConnectionPool, commands: Sequence[Command]) -> list[Any]:
    conn = _borrowed(pool)
    try:
        return _send(conn, commands)
    finally:
        pool.release(conn)


def _send(conn: Connection, commands: Sequence[Command]) -> list[Any]:
    try:
        return conn.retry.call_with_retry(lambda: _send_and_read(conn, commands), lambda _: conn.disconnect())
    except BaseException:
        conn.disconnect()  # replies may be left unread: never reuse the connection as it is
        raise


def _send_and_read(conn: Connection, commands: Sequence[Command]) -> list[Any]:
    conn.send_packed_command(conn.pack_commands(commands))
    return [_read(conn) for _ in commands]


def _read(conn: Connection) -> Any:
    """The next reply on ``conn``; an error reply is returned, not raised."""
    try:
        return conn.read_response()
    except ResponseError as exc:
        return exc


def transport_for(
    client: redis.Redis | RedisCluster, replication: Replication = Replication()
) -> ServerTransport | ClusterTransport:
    if isinstance(client, RedisCluster):
        return ClusterTransport(client, replication)
    return ServerTransport(client, replication)
