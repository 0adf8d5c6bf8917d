"""Real local multi-node Redis set-ups for the tests: a Redis Cluster and a Sentinel set.

Every node is a real redis-server (``servers.RedisServer``) on a free port, in a directory of its own
under the given one, where its log (``redis.log``) stays. Nothing is mocked: a killed node is a SIGKILL.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterable
from contextlib import suppress
from pathlib import Path
from typing import Any, Self

import redis
from redis.crc import key_slot

from testproject.servers import RedisServer, ServerError, free_port

HOST = "127.0.0.1"

#: A master streams its data to a new replica at once (by default it waits 5 s for more replicas to come).
QUICK_SYNC = ("--repl-diskless-sync-delay", "0")


def _client(port: int | None) -> redis.Redis:
    assert port is not None, "a RedisServer's URL names its port"
    # A short timeout: a node that hangs is not ready, and the waits below go round again.
    return redis.Redis(host=HOST, port=port, decode_responses=True, socket_timeout=2, socket_connect_timeout=2)


def _ask(port: int | None, *command: Any) -> Any:
    """A command's reply as the server sends it: redis-py parses some (INFO) and not others (CLUSTER INFO)."""
    with _client(port) as client:
        connection = client.connection_pool.get_connection()
        try:
            connection.send_command(*command)
            return connection.read_response()
        finally:
            client.connection_pool.release(connection)


def _wait(check: Callable[[], bool], timeout: float, failure: str) -> None:
    """Poll ``check`` until it holds; a Redis error counts as "not yet" (a node starting or just killed)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except redis.RedisError:
            pass
        if time.monotonic() > deadline:
            raise ServerError(failure)
        time.sleep(0.1)


def _free_ports(count: int) -> list[int]:
    """Distinct free ports (two calls of ``free_port`` may hand out the same one)."""
    ports: dict[int, None] = {}
    while len(ports) < count:
        ports[free_port()] = None
    return list(ports)


def _logs(servers: Iterable[RedisServer]) -> str:
    return ", ".join(str(server.directory / "redis.log") for server in servers)


def _kill(node: RedisServer) -> None:
    assert node.process is not None, "start() first"
    node.process.kill()
    node.process.wait()


class _Topology:
    """Start, stop and context manager: a failed start stops what it started."""

    def start(self) -> Self:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None: ...

    def stop(self) -> None: ...

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


class LocalCluster(_Topology):
    """A Redis Cluster of 3 masters (and ``replicas`` replicas each), made by ``redis-cli --cluster create``."""

    def __init__(self, directory: Path, *, replicas: int = 0, node_timeout_ms: int = 2000) -> None:
        self.directory = directory
        self.replicas = replicas
        self.node_timeout_ms = node_timeout_ms
        count = 3 * (1 + replicas)
        # The bus port is set apart (cluster-port): the default, port + 10000, may be taken or past 65535.
        ports = _free_ports(2 * count)
        self.nodes = [RedisServer(f"redis://{HOST}:{p}", directory / f"node-{p}") for p in ports[:count]]
        self._bus_ports = dict(zip(ports[:count], ports[count:], strict=True))
        self._first_master = self.nodes[0]

    @property
    def url(self) -> str:
        """The URL a user gives: one node; clients discover the others from it."""
        return f"redis://{HOST}:{self._first_master.port}"

    def _args(self, node: RedisServer) -> tuple[str, ...]:
        assert node.port is not None
        return (
            *QUICK_SYNC,
            *("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"),
            *("--cluster-node-timeout", str(self.node_timeout_ms), "--cluster-port", str(self._bus_ports[node.port])),
        )

    def _start(self) -> None:
        for node in self.nodes:
            node.launch(*self._args(node))
        for node in self.nodes:
            node.wait_ready()
        cli = shutil.which("redis-cli") or "redis-cli"  # in Debian's redis-tools, which redis-server needs
        addresses = [f"{HOST}:{node.port}" for node in self.nodes]
        command = [cli, "--cluster", "create", *addresses, "--cluster-replicas", str(self.replicas), "--cluster-yes"]
        log = self.directory / "cluster-create.log"
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
        log.write_text(done.stdout + done.stderr)
        if done.returncode != 0:
            raise ServerError(f"redis-cli --cluster create failed: see {log}")
        self.wait_ok()
        self._first_master = self.masters()[0]

    def wait_ok(self, timeout: float = 30) -> None:
        """Until every node says ``cluster_state:ok``, sees no node failing and agrees on the slots,
        and every replica is in sync with its master."""

        def ok() -> bool:
            maps = []
            for node in self.nodes:
                if "cluster_state:ok" not in _ask(node.port, "CLUSTER", "INFO"):
                    return False
                if "fail" in _ask(node.port, "CLUSTER", "NODES"):  # "fail" or "fail?" in a node's flags
                    return False
                replication = _ask(node.port, "INFO", "replication")
                if "role:slave" in replication and "master_link_status:up" not in replication:
                    return False
                maps.append(self._slots(node.port))
            return all(m == maps[0] for m in maps) and sum(end - start + 1 for start, end, _ in maps[0]) == 16384

        create_log = self.directory / "cluster-create.log"
        _wait(ok, timeout, f"the cluster is not ok after {timeout} s: see {create_log}, {_logs(self.nodes)}")

    def _slots(self, port: int | None) -> list[tuple[int, int, int]]:
        """The slot ranges and their master's port, as the node on ``port`` sees them."""
        return sorted((int(r[0]), int(r[1]), int(r[2][1])) for r in _ask(port, "CLUSTER", "SLOTS"))

    def _live_slots(self) -> list[tuple[int, int, int]]:
        for node in self.nodes:
            with suppress(redis.ConnectionError):  # a node down: ask the next
                return self._slots(node.port)
        raise ServerError(f"no node of the cluster in {self.directory} answers")

    def masters(self) -> list[RedisServer]:
        """The nodes that own slots now (after a failover, not those that were made masters)."""
        owners = {port for _, _, port in self._live_slots()}
        return [node for node in self.nodes if node.port in owners]

    def node_for_key(self, name: str) -> RedisServer:
        """The master that owns the slot of the key ``name``."""
        slot = key_slot(name.encode())
        owner = next(port for start, end, port in self._live_slots() if start <= slot <= end)
        return next(node for node in self.nodes if node.port == owner)

    def restart(self, node: RedisServer) -> None:
        """SIGKILL the node and start it again on its port, directory and nodes.conf; back with no data."""
        _kill(node)
        node.start(*self._args(node))
        self.wait_ok()

    def flushall(self) -> None:
        """No keys on any master and no scripts cached on any node: a test starts clean."""
        for node in self.masters():
            _ask(node.port, "FLUSHALL")
        for node in self.nodes:
            _ask(node.port, "SCRIPT", "FLUSH")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


class _SentinelServer(RedisServer):
    """A ``redis-server --sentinel``: its config file must come first, so it does not take RedisServer's options."""

    def launch(self, *extra: str) -> _SentinelServer:
        binary = shutil.which("redis-server") or "redis-server"  # RedisServer says where to find it
        with open(self.directory / "redis.log", "ab") as log:
            self.process = subprocess.Popen(
                [binary, str(self.directory / "sentinel.conf"), "--sentinel", *extra],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self


class LocalSentinel(_Topology):
    """One master, one replica and three sentinels watching them (quorum 2).

    ``down_after_ms`` must exceed 1000 by a margin: after a failover a sentinel may connect to the new
    master only up to 1 s later (it retries connections once a second, and was retrying the dead one),
    while the new master's down-after clock runs from the switch. At 1000, seen once in ~30 runs,
    the sentinels then judged the new master down and failed over back to the restarted old one.
    """

    def __init__(self, directory: Path, *, master_name: str = "mymaster", down_after_ms: int = 2000) -> None:
        self.directory = directory
        self.master_name = master_name
        self.down_after_ms = down_after_ms
        ports = _free_ports(5)
        self.data_nodes = [RedisServer(f"redis://{HOST}:{p}", directory / f"data-{p}") for p in ports[:2]]
        self.sentinels = [_SentinelServer(f"redis://{HOST}:{p}", directory / f"sentinel-{p}") for p in ports[2:]]

    @property
    def sentinel_ports(self) -> list[int]:
        return [s.port for s in self.sentinels if s.port is not None]

    @property
    def url(self) -> str:
        """The sentinels as Celery's broker URL lists them."""
        return ";".join(f"sentinel://{HOST}:{port}" for port in self.sentinel_ports)

    def _start(self) -> None:
        master, replica = self.data_nodes
        master.start(*QUICK_SYNC)
        self._start_replica(replica, master)
        for sentinel in self.sentinels:
            sentinel.directory.mkdir(parents=True, exist_ok=True)
            # Written once: a sentinel rewrites its config with what it learns (epochs, replicas, peers).
            (sentinel.directory / "sentinel.conf").write_text(
                f"port {sentinel.port}\nbind {HOST}\nprotected-mode no\ndir {sentinel.directory}\n"
                f"sentinel monitor {self.master_name} {HOST} {master.port} 2\n"
                f"sentinel down-after-milliseconds {self.master_name} {self.down_after_ms}\n"
                f"sentinel failover-timeout {self.master_name} 5000\n"
                f"sentinel parallel-syncs {self.master_name} 1\n"
            )
            sentinel.launch()
        for sentinel in self.sentinels:
            sentinel.wait_ready()
        self._wait_sentinels_see(replica)

    def _start_replica(self, node: RedisServer, master: RedisServer) -> None:
        # QUICK_SYNC too: after a failover, this replica may become the master the other syncs from.
        node.start(*QUICK_SYNC, "--replicaof", HOST, str(master.port))
        _wait(
            lambda: "master_link_status:up" in _ask(node.port, "INFO", "replication"),
            30,
            f"the replica never synced with its master: see {node.directory / 'redis.log'}",
        )

    def _wait_sentinels_see(self, replica: RedisServer, timeout: float = 30) -> None:
        """Until every sentinel knows the replica (up) and the two other sentinels."""

        def seen() -> bool:
            for port in self.sentinel_ports:
                with _client(port) as client:
                    replicas = client.sentinel_slaves(self.master_name)
                    peers = client.sentinel_sentinels(self.master_name)
                up = [r for r in replicas if r["port"] == replica.port and not (r["is_sdown"] or r["is_disconnected"])]
                if not up or len(peers) != len(self.sentinels) - 1:
                    return False
            return True

        failure = f"the sentinels do not see the replica and each other after {timeout} s: see {_logs(self.sentinels)}"
        _wait(seen, timeout, failure)

    def _reports(self) -> list[int]:
        """The master's port, as each sentinel that answers reports it."""
        ports = []
        for port in self.sentinel_ports:
            with suppress(redis.RedisError), _client(port) as client:  # a sentinel down: ask the others
                ports.append(int(client.sentinel_get_master_addr_by_name(self.master_name)[1]))
        return ports

    def master(self) -> RedisServer:
        """The data node that most sentinels report as master now."""
        reports = Counter(self._reports()).most_common(1)
        if not reports:
            raise ServerError(f"no sentinel in {self.directory} answers")
        return next(node for node in self.data_nodes if node.port == reports[0][0])

    def replica(self) -> RedisServer:
        master = self.master()
        return next(node for node in self.data_nodes if node is not master)

    def kill_master(self) -> RedisServer:
        """SIGKILL the current master; the sentinels notice it after ``down_after_ms``."""
        master = self.master()
        _kill(master)
        return master

    def wait_for_failover(self, old: RedisServer, timeout: float = 30) -> RedisServer:
        """Until every sentinel reports another master than ``old`` and that node says it is master."""

        def failed_over() -> bool:
            reports = self._reports()
            if len(reports) < len(self.sentinels) or len(set(reports)) != 1 or reports[0] == old.port:
                return False
            return _ask(reports[0], "ROLE")[0] == "master"

        _wait(failed_over, timeout, f"no failover from {old.url} within {timeout} s: see {_logs(self.sentinels)}")
        return self.master()

    def restart(self, node: RedisServer) -> None:
        """Start a killed data node again, as a replica of the current master: the set is whole again."""
        if node is self.master():
            raise ServerError(f"{node.url} is still the master: wait_for_failover() first")
        self._start_replica(node, self.master())
        self._wait_sentinels_see(node)

    def stop(self) -> None:
        # The sentinels first, so that they do not fail over from data nodes that are stopping.
        for server in [*self.sentinels, *self.data_nodes]:
            server.stop()
