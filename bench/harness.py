"""What the benchmarks share: a private cluster (two redis-servers, a SQLite file, real workers) and counters.

Everything starts in one temp dir and is stopped by ``Cluster.stop`` whatever happened. The environment
variables are set before Django is imported so the benchmark process and the workers it starts see the
same addresses.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from testproject.servers import free_port

#: The repository's root: a benchmark's child processes run from it, as python -m bench.<name>.
ROOT = Path(__file__).resolve().parent.parent


def wait_for(condition: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    """Poll ``condition`` until it holds (True) or ``timeout`` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True


#: The records' databases the benchmarks compare: SQLite as `startproject` makes it (rollback journal),
#: SQLite in WAL mode (the testproject's), and PostgreSQL with durable commits.
DATABASES = ("sqlite", "sqlite-wal", "postgresql")


class Cluster:
    """Broker redis-server (broker db 1, results db 2, history db 3), gate redis-server (or the broker's
    db 0, ``gate_on_broker``), the records' database, workers (``prefetch`` messages per process)."""

    def __init__(
        self,
        workers: int,
        concurrency: int,
        keep: bool = False,
        *,
        database: str = "sqlite-wal",
        gate_on_broker: bool = False,
        prefetch: int = 1,
    ) -> None:
        if database not in DATABASES:
            raise ValueError(f"database must be one of {', '.join(DATABASES)}, got {database!r}")
        self.dir = Path(tempfile.mkdtemp(prefix="keyed-queue-bench-"))
        self.keep = keep
        self.database = database
        self.broker_url = f"redis://127.0.0.1:{free_port()}"
        self.gate_url = self.broker_url if gate_on_broker else f"redis://127.0.0.1:{free_port()}"
        self.n_workers = workers
        self.concurrency = concurrency
        self.servers: list = []
        self.workers: list = []
        self.postgres = None
        os.environ.update(
            {
                "DJANGO_SETTINGS_MODULE": "testproject.settings",
                "TESTPROJECT_DATA_DIR": str(self.dir),
                "TESTPROJECT_DB": str(self.dir / "db.sqlite3"),
                "TESTPROJECT_REDIS_URL": self.broker_url,
                "TESTPROJECT_GATE_REDIS_URL": f"{self.gate_url}/0",
                "TESTPROJECT_PREFETCH": str(prefetch),
                # Production-like: no query log in the producer or the workers.
                "TESTPROJECT_DEBUG": "0",
            }
        )
        if database == "sqlite":
            os.environ["TESTPROJECT_SQLITE"] = "startproject"

    def start(self) -> None:
        from testproject.servers import PostgresServer, RedisServer, Worker

        urls = {"broker": self.broker_url, "gate": self.gate_url}
        for name, url in urls.items():
            if name == "gate" and url == self.broker_url:
                continue  # one server for both
            server = RedisServer(url, self.dir / f"redis-{name}")
            self.servers.append(server)
            server.start()
        if self.database == "postgresql":
            self.postgres = PostgresServer(log_dir=self.dir / "postgresql", durable=True).start()
            self.postgres.create_database("bench")
            os.environ["TESTPROJECT_DATABASE_URL"] = self.postgres.url("bench")

        import django
        from django.core.management import call_command

        django.setup()
        call_command("migrate", verbosity=0, interactive=False)

        for i in range(1, self.n_workers + 1):
            worker = Worker(f"bench{i}", self.dir / "logs", concurrency=self.concurrency)
            self.workers.append(worker)
            worker.start(timeout=60)

    def stop(self, failed: bool = False) -> None:
        for worker in self.workers:
            try:
                worker.stop()
            except Exception as exc:  # keep stopping the rest
                print(f"stopping worker {worker.name} failed: {exc!r}", file=sys.stderr)
        for server in self.servers:
            try:
                server.stop()
            except Exception as exc:
                print(f"stopping redis-server {server.url} failed: {exc!r}", file=sys.stderr)
        if self.postgres is not None:
            from django.db import connections

            connections.close_all()
            self.postgres.stop()
        if self.keep or failed:
            print(f"kept {self.dir} (logs, database)", file=sys.stderr)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)

    def worker_log_problems(self) -> list[str]:
        """Lines of the worker logs at WARNING or worse, and tracebacks."""
        pattern = re.compile(r"WARNING|ERROR|CRITICAL|Traceback|database is locked")
        lines = []
        for worker in self.workers:
            if worker.log_path.exists():
                lines += [f"{worker.name}: {line}" for line in worker.log().splitlines() if pattern.search(line)]
        return lines


class StoredMessage:
    """A real message the gate stores for ``step(key, n)``, as Celery builds it (submitted once through
    ``apply_async`` behind the paused ``key``), and copies of it under fresh task ids."""

    def __init__(self, gate, key: str, n: object, queue: str) -> None:
        from django_keyed_queue.gate.keys import KeyNames
        from testproject.demo.tasks import step

        gate.pause(key)
        sent = step.apply_async((key, n), queue=queue)
        self.message: bytes = gate.client.hget(KeyNames(key).messages, gate.inspect(key).last_ticket)
        self.task_id: str = sent.id

    def copy(self) -> tuple[str, bytes]:
        """A fresh task id, and the message with it in place of the original's."""
        task_id = str(uuid.uuid4())
        return task_id, self.message.replace(self.task_id.encode(), task_id.encode())


def main_per_database(
    module: str,
    parser: argparse.ArgumentParser,
    argv: list[str] | None,
    child: Callable[[argparse.Namespace], dict],
    report: Callable[[list[dict], argparse.Namespace], str],
) -> int:
    """A benchmark's ``main`` that measures on each database in a process of its own: with ``--database`` it is
    that child (``child`` measures, its JSON printed), else it runs one per ``--databases`` and prints
    ``report`` of their results."""
    parser.add_argument("--databases", default="sqlite,postgresql")
    parser.add_argument("--database", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.database:
        print(json.dumps(child(args)))
        return 0
    print(report(per_database(module, argv or sys.argv[1:], args.databases), args))
    return 0


def per_database(module: str, argv: list[str], databases: str) -> list[dict]:
    """Run ``python -m module *argv --database D`` for each of ``databases`` (comma-separated), each in a
    process of its own (Django is configured once per process); the JSON each printed last."""
    results = []
    for database in databases.split(","):
        command = [sys.executable, "-m", module, *argv, "--database", database]
        done = subprocess.run(command, cwd=ROOT, stdout=subprocess.PIPE, check=True, text=True, env=dict(os.environ))
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return results


def proc_stat(pid: int | str) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command's name (``fields[0]`` is its state, ``fields[11]``
    and ``fields[12]`` its user and system CPU ticks); None for a process that is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def cpu_seconds(groups: dict[str, list[int]]) -> dict[str, float]:
    """CPU time (user + system) of each group of processes and all their live descendants, from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    parent, used = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = proc_stat(entry)
        if fields is None:
            continue
        pid = int(entry)
        parent[pid] = int(fields[1])
        used[pid] = (int(fields[11]) + int(fields[12])) / tick
    out = {}
    for name, roots in groups.items():
        members = set(roots)
        grew = True
        while grew:
            new = {pid for pid, ppid in parent.items() if ppid in members} - members
            members |= new
            grew = bool(new)
        out[name] = sum(used.get(pid, 0.0) for pid in members)
    return out


class CommandStats:
    """INFO commandstats of one redis-server, as a Counter of calls per command."""

    def __init__(self, client) -> None:
        self.client = client

    def snapshot(self) -> Counter:
        stats = self.client.info("commandstats")
        return Counter({name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()})

    @staticmethod
    def delta(before: Counter, after: Counter) -> Counter:
        out = Counter(after)
        out.subtract(before)
        out["info"] -= 1  # the snapshot's own INFO
        return +out  # drop zeros and negatives


# Commands the gate's scripts call inside Redis: counted by commandstats, but not round trips.
IN_SCRIPT = frozenset(
    "hget hgetall hvals hset hdel hincrby hlen hexists lpop rpush llen lrem persist pexpire time "
    "zadd zscore zremrangebyscore".split()
)


def gate_round_trips(delta: Counter) -> int:
    """Commands sent by clients: everything but the commands run inside scripts."""
    return sum(calls for name, calls in delta.items() if name not in IN_SCRIPT)


class Timers:
    """Wall time spent in named functions of this process (the submit path), for --profile."""

    def __init__(self) -> None:
        self.seconds: Counter = Counter()
        self.calls: Counter = Counter()

    def wrap(self, owner, attr: str, label: str) -> None:
        original = getattr(owner, attr)
        timers = self

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                timers.seconds[label] += time.perf_counter() - t0
                timers.calls[label] += 1

        setattr(owner, attr, timed)

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()
