"""Throughput of keyed serial tasks against plain Celery tasks in a project made exactly as a user makes one.

    python -m bench.userproject [--tasks 2000 --keys 500 --hot-tasks 400 --rounds 3]
                                [--database sqlite|sqlite-wal|postgresql] [--peer procrastinate]
                                [--json PATH] [--keep]

The project is testproject/userproject/project.py's: ``django-admin startproject mysite``, ``startapp shop``,
the README's install blocks (Celery's documented Django layout, Celery's default settings, ONE redis-server for
the broker and the gate), plus ``DEBUG = False``. Its records' database is SQLite as ``startproject`` makes
it (``--database sqlite``, the default), the same file in WAL mode with ``synchronous=NORMAL`` (an
``init_command``), or a PostgreSQL server with durable commits. One worker runs as Celery's docs say,
``celery -A mysite worker -l INFO`` with ``-c 2``. The tasks are the project's ``shop.tasks.step`` (keyed,
``key="{key}"``) and ``plain_step`` (a plain ``@shared_task``) with ``seconds=0``: each logs a start and an
end line, with its time, to ``history.jsonl`` in the project.

A producer, bench/userproject_produce.py copied into the project and run there with its environment,
submits as fast as it can and prints the time of its first submission and of its last. Plain and keyed
rounds alternate (after a small warm-up of each), in two scenarios:

- many keys: ``--tasks`` tasks over ``--keys`` keys in a seeded shuffle, each key's tasks numbered
  n = 0, 1, 2...; a third variant, ``bulk``, submits the same calls with one ``step.apply_async_many``;
- one hot key: ``--hot-tasks`` tasks on one key; the keyed rounds' handoffs (end of task n to start of n+1)
  are taken from the history's times.

With ``--database postgresql --peer procrastinate`` each scenario also has procrastinate rounds, a peer
(bench/peer_procrastinate.py): the same task body, plan and checks, each task deferred with
``lock=<its key>``, one procrastinate worker at the Celery worker's concurrency, on the same PostgreSQL
database; the ratios add keyed/procrastinate.

Throughput = tasks / (last end - first submission), on this machine's clock. After each round the bench waits
until every task ended, the keyed records (or the peer's jobs) are terminal and the worker is idle; the next
round empties the history first (the last round's is kept, with ``--keep``).
Exits 1 if a task was lost or ran twice, a keyed or peer round broke its keys' order or exclusion (read from
the order of the history's lines, appended across processes), a keyed record or a peer's job did not end
``succeeded``, or a round timed out.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import closing
from dataclasses import asdict
from pathlib import Path

from testproject.servers import PostgresServer, RedisServer, free_port
from testproject.userproject.project import UserProject

from .harness import DATABASES, cpu_seconds
from .peer_procrastinate import ProcrastinatePeer
from .report import print_ending, print_ratios, print_targets, summarize
from .stats import median
from .throughput import Round, check_events, handoffs_ms, many_keys_plan

PRODUCER = Path(__file__).resolve().parent / "userproject_produce.py"
#: The producer's name in the project's directory.
PRODUCER_NAME = "bench_produce.py"
CONCURRENCY = 2
WAL_INIT_COMMAND = "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"
PG_DATABASE = "mysite"
#: The peers that ``--peer`` adds, each on PostgreSQL.
PEERS = {"procrastinate": ProcrastinatePeer}


def group_cpu_seconds(groups: dict[str, list[int]]) -> dict[str, float]:
    """``harness.cpu_seconds`` (each group's live processes) plus the CPU of the roots' children that have
    exited: PostgreSQL's backends, one per connection, which Celery's Django fixup closes after each task."""
    tick = os.sysconf("SC_CLK_TCK")
    used = cpu_seconds(groups)
    for name, roots in groups.items():
        for pid in roots:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            used[name] += (int(fields[13]) + int(fields[14])) / tick  # cutime + cstime: children waited for
    return used


class History:
    """The project's history.jsonl, read as it grows (only the new bytes on each read)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._forget()

    def clear(self) -> None:
        """Empty the file: call it only while no task runs."""
        self.path.write_bytes(b"")
        self._forget()

    def _forget(self) -> None:
        self.events: list[dict] = []
        self.ended: set[tuple[str, int]] = set()
        self._offset = 0
        self._partial = b""

    def read(self) -> list[dict]:
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            data = f.read()
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()  # b"" after a whole line
        for line in lines:
            event = json.loads(line)
            self.events.append(event)
            if event["event"] == "end":
                self.ended.add((event["key"], event["n"]))
        return self.events


class Bench:
    """The user's project, its one redis-server, its database server if any, and its one worker."""

    def __init__(self, args: argparse.Namespace, directory: Path) -> None:
        self.args = args
        self.directory = directory
        self.redis = RedisServer(f"redis://127.0.0.1:{free_port()}", directory / "redis")
        self.postgres: PostgresServer | None = None
        self.project = UserProject(directory / "mysite", self.redis.url)
        self.history = History(self.project.directory / "history.jsonl")
        self.cpu_groups: dict[str, list[int]] = {}
        self.peer = PEERS[args.peer](self.project, CONCURRENCY) if args.peer else None

    def start(self) -> None:
        self.redis.start()
        settings: dict = {"DEBUG": False}  # appended as `NAME = repr(value)`: plain values only
        if self.args.database == "sqlite-wal":
            settings["DATABASES"] = {
                "default": {
                    "ENGINE": "django.db.backends.sqlite3",
                    "NAME": str(self.project.directory / "db.sqlite3"),  # startproject's file
                    "OPTIONS": {"init_command": WAL_INIT_COMMAND},
                }
            }
        elif self.args.database == "postgresql":
            self.postgres = PostgresServer(log_dir=self.directory / "postgresql", durable=True)
            self.postgres.start()
            self.postgres.create_database(PG_DATABASE)
            settings["DATABASES"] = {
                "default": {
                    "ENGINE": "django.db.backends.postgresql",
                    "NAME": PG_DATABASE,
                    "USER": self.postgres.user,
                    "HOST": str(self.postgres.directory),  # its unix socket's directory
                    "PORT": str(self.postgres.port),
                }
            }
        self.project.settings = settings
        self.project.build()  # startproject migrated the SQLite file; a PostgreSQL database is migrated here
        if self.peer is not None:
            self.peer.install()  # before migrate, which makes its tables too
        if self.postgres is not None:
            self.project.manage("migrate", "--verbosity", "0")
        shutil.copy(PRODUCER, self.project.directory / PRODUCER_NAME)
        worker = self.project.worker("bench", concurrency=CONCURRENCY)
        assert worker.process is not None
        self.cpu_groups = {"worker": [worker.process.pid], "redis": [self.redis.process.pid]}
        if self.postgres is not None:
            postmaster = self.postgres.directory / "data" / "postmaster.pid"
            self.cpu_groups["postgres"] = [int(postmaster.read_text().split()[0])]
        if self.peer is not None:
            self.cpu_groups[self.peer.name] = []  # its worker's, during its rounds

    def stop(self) -> None:
        for worker in self.project.workers:
            try:
                worker.stop()
            except Exception as exc:  # keep stopping the rest
                print(f"stopping worker {worker.name} failed: {exc!r}", file=sys.stderr)
        for server in (self.redis, self.postgres):
            try:
                if server is not None:
                    server.stop()
            except Exception as exc:
                print(f"stopping {type(server).__name__} failed: {exc!r}", file=sys.stderr)

    def peer_of(self, variant: str) -> ProcrastinatePeer | None:
        """The peer whose rounds ``variant`` names, if any."""
        return self.peer if self.peer is not None and variant == self.peer.name else None

    def run_round(self, scenario: str, index: int, variant: str, plan: list[tuple[str, int]]) -> Round:
        peer = self.peer_of(variant)
        if peer is None:
            return self.measure_round(scenario, index, variant, plan)
        with peer.worker() as pid:  # started and ready before the round's first submission
            self.cpu_groups[variant] = [pid]
            try:
                return self.measure_round(scenario, index, variant, plan)
            finally:
                self.cpu_groups[variant] = []

    def measure_round(self, scenario: str, index: int, variant: str, plan: list[tuple[str, int]]) -> Round:
        result = Round(scenario, index, variant, len(plan))
        self.history.clear()  # the worker is idle: the last round waited for it (a failed round is the last)
        (self.project.directory / "plan.json").write_text(json.dumps(plan))
        deadline = time.monotonic() + self.args.timeout
        if self.postgres is not None:
            # Statistics as a database in service keeps them: a fresh server's first autovacuum ANALYZE
            # comes a minute in, and a round planned on an empty table's ran a peer's job fetches 8x slower.
            self.pg_execute("ANALYZE")
        cpu0 = group_cpu_seconds(self.cpu_groups)
        sent = self.produce(variant, result)
        if sent is None:
            return result
        result.submit_seconds = sent["last"] - sent["first"]
        result.cpu["producer"] = sent["cpu"]

        planned = set(plan)
        while not planned <= self.history.ended and time.monotonic() < deadline:
            time.sleep(0.05)
            self.history.read()
        events = self.history.read()
        ends = [e["t"] for e in events if e["event"] == "end"]
        result.wall_seconds = (max(ends) if ends else time.time()) - sent["first"]
        result.problems += check_events(events, plan, serial=variant != "plain")
        if not planned <= self.history.ended:
            missing = len(planned - self.history.ended)
            result.problems.append(f"timed out after {self.args.timeout:.0f} s: {missing} of {len(plan)} not ended")
            return result
        if variant != "plain":
            result.settle_seconds = self.wait_recorded(variant, sent["ids"], deadline, result) - sent["first"]
        if scenario == "hot-key" and variant != "plain":
            result.handoffs_ms = handoffs_ms(events)
        if not self.wait_idle(deadline):
            result.problems.append("the worker was still busy at the round's deadline")
        cpu1 = group_cpu_seconds(self.cpu_groups)
        result.cpu.update({name: cpu1[name] - cpu0[name] for name in cpu0})
        return result

    def produce(self, variant: str, result: Round) -> dict | None:
        """The producer's report ({"first", "last", "cpu", "ids"}), or None with the round's problem noted."""
        peer = self.peer_of(variant)
        script = peer.script if peer is not None else PRODUCER_NAME
        command = [sys.executable, script, variant, "plan.json"]
        producer = subprocess.Popen(
            command,
            cwd=self.project.directory,
            env=self.project.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            out, err = producer.communicate(timeout=self.args.timeout)
        except subprocess.TimeoutExpired:
            producer.kill()
            producer.communicate()
            result.problems.append(f"the producer did not finish in {self.args.timeout:.0f} s")
            return None
        if producer.returncode != 0 or not out.strip():
            result.problems.append(f"the producer exited {producer.returncode}:\n{err[-3000:]}")
            return None
        return json.loads(out.splitlines()[-1])

    def statuses(self, ids: list[str]) -> Counter:
        """The statuses of the records of ``ids``, read straight from the project's database."""
        if self.postgres is None:
            query = (
                "SELECT status, COUNT(*) FROM keyed_queue_keyedtask "
                "WHERE task_id IN (SELECT value FROM json_each(?)) GROUP BY status"
            )
            path = self.project.directory / "db.sqlite3"
            with closing(sqlite3.connect(path, timeout=30)) as db:
                rows = db.execute(query, [json.dumps(ids)]).fetchall()
        else:
            query = "SELECT status, COUNT(*) FROM keyed_queue_keyedtask WHERE task_id = ANY(%s) GROUP BY status"
            rows = self.pg_rows(query, [ids])
        return with_missing(Counter(dict(rows)), ids)

    def pg_rows(self, query: str, params: list) -> list[tuple]:
        with self.pg_connection() as conn:
            return conn.execute(query, params).fetchall()

    def pg_execute(self, statement: str) -> None:
        with self.pg_connection() as conn:
            conn.execute(statement)

    def pg_connection(self):  # a psycopg.Connection (imported here: only the PostgreSQL runs need it)
        import psycopg

        pg = self.postgres
        assert pg is not None
        return psycopg.connect(host=str(pg.directory), port=pg.port, user=pg.user, dbname=PG_DATABASE)

    def wait_recorded(self, variant: str, ids: list, deadline: float, result: Round) -> float:
        """time.time() when every keyed record, or the peer's job, of ``ids`` was terminal (or at the
        deadline, with the problem noted)."""
        from django_keyed_queue.records.statuses import TERMINAL_STATUSES

        peer = self.peer_of(variant)
        terminal = peer.terminal_statuses if peer is not None else TERMINAL_STATUSES
        while True:
            if peer is not None:
                counts = with_missing(Counter(dict(self.pg_rows(peer.status_query, [ids]))), ids)
            else:
                counts = self.statuses(ids)
            if sum(counts[s] for s in terminal) == len(ids) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        settled = time.time()
        if counts != Counter({"succeeded": len(ids)}):
            result.problems.append(f"{'jobs' if peer is not None else 'records'} not all succeeded: {dict(counts)}")
        return settled

    def wait_idle(self, deadline: float, window: float = 0.25, busy_cpu: float = 0.01) -> bool:
        """Until the worker's processes used under ``busy_cpu`` s of CPU in each of two ``window``s in a row."""
        worker = {"worker": self.cpu_groups["worker"]}
        quiet, before = 0, cpu_seconds(worker)["worker"]
        while quiet < 2:
            if time.monotonic() > deadline:
                return False
            time.sleep(window)
            now = cpu_seconds(worker)["worker"]
            quiet = quiet + 1 if now - before < busy_cpu else 0
            before = now
        return True

    def worker_log_problems(self) -> list[str]:
        """Lines of the worker's log at WARNING or worse, and tracebacks."""
        pattern = re.compile(r"WARNING|ERROR|CRITICAL|Traceback|database is locked")
        lines = []
        for worker in self.project.workers:
            if worker.log_path.exists():
                lines += [f"{worker.name}: {line}" for line in worker.log().splitlines() if pattern.search(line)]
        if self.peer is not None:
            lines += self.peer.log_problems()
        return lines


def with_missing(counts: Counter, ids: list) -> Counter:
    """``counts`` of statuses, plus ``missing``: the ids that have no row."""
    counts["missing"] = len(ids) - sum(counts.values())
    return +counts


def print_rounds(rounds: list[Round]) -> None:
    groups = next((list(r.cpu) for r in rounds if r.cpu), [])
    widths = {name: max(8, len(name)) for name in groups}
    cpu = " ".join(f"{name:>{widths[name]}}" for name in groups)
    variant_width = max([7, *(len(r.variant) for r in rounds)])
    header = (
        f"{'scenario':<10} {'rnd':>3} {'variant':<{variant_width}} {'tasks':>6} {'submit s':>9} {'wall s':>7} "
        f"{'tasks/s':>8} {'settle s':>8}  CPU ms/task: {cpu}"
    )
    print(header)
    print("-" * len(header))
    for r in rounds:
        settle = f"{r.settle_seconds:8.2f}" if r.settle_seconds is not None else f"{'-':>8}"
        cells = " ".join(f"{1000 * r.cpu.get(name, 0.0) / r.tasks:>{widths[name]}.2f}" for name in groups)
        print(
            f"{r.scenario:<10} {r.index:>3} {r.variant:<{variant_width}} {r.tasks:>6} {r.submit_seconds:>9.2f} "
            f"{r.wall_seconds:>7.2f} {r.throughput:>8.0f} {settle}  {'':>12} {cells}"
        )


def print_summary(summary: dict) -> None:
    if summary:
        print_ratios(summary)
        print_targets(summary)


def print_settle(rounds: list[Round]) -> None:
    kinds = {"keyed records": ("keyed", "bulk"), **{f"{peer} jobs": (peer,) for peer in PEERS}}
    for kind, variants in kinds.items():
        settle = [
            r.settle_seconds - r.wall_seconds for r in rounds if r.variant in variants and r.settle_seconds is not None
        ]
        if settle:
            print(f"{kind} all terminal in the database {median(settle):.2f} s (median) after the last task ended")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=2000, help="tasks per many-keys round (0 skips)")
    parser.add_argument("--keys", type=int, default=500, help="keys of the many-keys rounds")
    parser.add_argument("--hot-tasks", type=int, default=400, help="tasks per hot-key round (0 skips)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each variant per scenario")
    parser.add_argument("--warm-up", type=int, default=100, help="tasks of the unmeasured first rounds (0 skips)")
    parser.add_argument("--no-bulk", dest="bulk", action="store_false", help="skip apply_async_many on many keys")
    parser.add_argument("--timeout", type=float, default=120, help="seconds a round may take")
    parser.add_argument(
        "--database",
        choices=DATABASES,
        default="sqlite",
        help="the records' database: SQLite as startproject makes it, SQLite in WAL mode, or PostgreSQL",
    )
    parser.add_argument(
        "--peer",
        choices=sorted(PEERS),
        help="add a peer's rounds to each scenario: procrastinate, each task locked by its key (PostgreSQL only)",
    )
    parser.add_argument("--json", type=Path, help="write the raw figures here")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (project, logs, history, database)")
    args = parser.parse_args(argv)
    if args.peer and args.database != "postgresql":
        parser.error(f"--peer {args.peer} runs on PostgreSQL: add --database postgresql")

    started = time.monotonic()
    directory = Path(tempfile.mkdtemp(prefix="keyed-queue-bench-userproject-"))
    bench = Bench(args, directory)
    rounds: list[Round] = []
    log_problems: list[str] = []
    failed = False
    try:
        bench.start()
        print(
            f"user project (startproject, README install blocks, Celery defaults, DEBUG = False), one redis-server "
            f"for broker and gate, records on {args.database}; 1 worker x prefork {CONCURRENCY}, {os.cpu_count()} "
            f"CPUs; setup {time.monotonic() - started:.1f} s; load average {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        if bench.peer is not None:
            print(f"peer: {bench.peer.describe()}; its jobs on the same database", flush=True)
        peer = (bench.peer.name,) if bench.peer is not None else ()
        schedule: list[tuple[str, int, str, list[tuple[str, int]]]] = []
        if args.warm_up:
            warm = many_keys_plan(args.warm_up, max(1, args.warm_up // 5), seed=1)
            schedule += [("warm-up", 0, variant, warm) for variant in ("plain", "keyed", *peer)]
        if args.tasks:
            plan = many_keys_plan(args.tasks, args.keys)
            variants = ("plain", "keyed", "bulk", *peer) if args.bulk else ("plain", "keyed", *peer)
            schedule += [("many-keys", i, v, plan) for i in range(1, args.rounds + 1) for v in variants]
        if args.hot_tasks:
            hot = [("hot", n) for n in range(args.hot_tasks)]
            schedule += [("hot-key", i, v, hot) for i in range(1, args.rounds + 1) for v in ("plain", "keyed", *peer)]
        for scenario, index, variant, plan in schedule:
            r = bench.run_round(scenario, index, variant, plan)
            print(f"  {scenario} round {index} {variant}: {r.throughput:.0f} tasks/s", flush=True)
            for problem in r.problems:
                print(f"FAILED {scenario} round {index} {variant}: {problem}", file=sys.stderr)
            if scenario != "warm-up":
                rounds.append(r)
            if r.problems:
                failed = True
                break  # a round that failed may leave tasks behind: the next would measure them too
    except BaseException:
        failed = True
        raise
    finally:
        log_problems = bench.worker_log_problems()
        bench.stop()
        if args.keep or failed:
            print(f"kept {directory} (project, worker log, history, database)", file=sys.stderr)
        else:
            shutil.rmtree(directory, ignore_errors=True)

    print(f"\nload average at the end {os.getloadavg()[0]:.2f}\n")
    print_rounds(rounds)
    summary = summarize([r for r in rounds if not r.problems])
    print_summary(summary)
    print_settle(rounds)
    print_ending(log_problems, time.monotonic() - started, failed=failed)

    if args.json:
        rows = [{**asdict(r), "throughput": r.throughput} for r in rounds]
        figures = {"args": vars(args), "summary": summary, "rounds": rows, "worker_log_problems": log_problems}
        args.json.write_text(json.dumps(figures, default=str, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
