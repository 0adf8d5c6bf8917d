"""The user's project of ``python -m bench.userproject``, its servers and worker, and one round measured in it."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from testproject.servers import PostgresServer, RedisServer, Worker, free_port
from testproject.userproject.project import UserProject

from .fairness import waits_ms
from .harness import cpu_seconds, proc_stat
from .peer_procrastinate import ProcrastinatePeer
from .project_database import KEYED_RECORDS, STORED_RESULTS, ProjectDatabase, with_missing
from .throughput import Round, check_events, child_process_ms, handoffs_ms
from .userproject_plan import NOOP, REALISTIC, ProjectRound, Workload, with_accounts
from .userproject_profile import sampled

PRODUCER = Path(__file__).resolve().parent / "userproject_produce.py"
#: The producer's name in the project's directory.
PRODUCER_NAME = "bench_produce.py"
WAL_INIT_COMMAND = "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"
PG_DATABASE = "mysite"
#: The peers that ``--peer`` adds, each on PostgreSQL, to the noop workload.
PEERS = {"procrastinate": ProcrastinatePeer}
#: The variants whose tasks of a key may run at once and in any order: plain Celery's.
UNORDERED = ("plain", "results")
#: A stored result's statuses once its task ran (Celery's ready states).
RESULT_TERMINAL = frozenset({"SUCCESS", "FAILURE", "REVOKED"})


class Rows(NamedTuple):
    """Where a variant's tasks leave a row each: their name, each status's count, which statuses are final, and
    the one every row must reach."""

    noun: str
    statuses: Callable[[list[str]], Counter]
    terminal: frozenset[str]
    succeeded: str


def group_cpu_seconds(groups: dict[str, list[int]]) -> dict[str, float]:
    """``harness.cpu_seconds`` (each group's live processes) plus the CPU of the roots' children that have
    exited: PostgreSQL's backends, one per connection, which Celery's Django fixup closes after each task."""
    tick = os.sysconf("SC_CLK_TCK")
    used = cpu_seconds(groups)
    for name, roots in groups.items():
        for pid in roots:
            fields = proc_stat(pid)
            if fields is None:
                continue
            used[name] += (int(fields[13]) + int(fields[14])) / tick  # cutime + cstime: children waited for
    return used


def own_cpu_seconds(pid: int) -> float:
    """CPU time (user + system) of process ``pid`` alone, not of its children; 0.0 if it is gone."""
    fields = proc_stat(pid)
    return 0.0 if fields is None else (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def split_worker(cpu: dict[str, float], main: float) -> dict[str, float]:
    """``cpu`` with its worker's share split in two, in its place: the worker's main process (``main``: it
    takes the broker's messages and hands them to its pool) and its child processes (they run the tasks)."""
    split = {}
    for name, used in cpu.items():
        if name == "worker":
            split["worker main"], split["child processes"] = main, used - main
        else:
            split[name] = used
    return split


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
        self.database = ProjectDatabase(self.project.directory / "db.sqlite3")
        self.history = History(self.project.directory / "history.jsonl")
        self.cpu_groups: dict[str, list[int]] = {}
        self.worker: Worker | None = None
        self.peer = PEERS[args.peer](self.project, NOOP.concurrency) if args.peer else None
        #: The sampled rounds (``--profile``): variant, profile, the worker's main pid, tasks, CPU by group.
        self.profiles: list[tuple[str, Path, int, int, dict[str, float]]] = []

    def start(self, accounts: int) -> None:
        """Everything but the worker (:meth:`use`); ``accounts`` rows of the user's Account model made."""
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
            self.database = ProjectDatabase(self.database.sqlite_path, self.postgres, PG_DATABASE)
            settings["DATABASES"] = {
                "default": {
                    "ENGINE": "django.db.backends.postgresql",
                    "NAME": PG_DATABASE,
                    "USER": self.postgres.user,
                    "HOST": str(self.postgres.directory),  # its unix socket's directory
                    "PORT": str(self.postgres.port),
                }
            }
        self.project.settings = {**settings, **self.args.settings}
        self.project.build()  # startproject migrated the SQLite file; a PostgreSQL database is migrated here
        if self.peer is not None:
            self.peer.install()  # before migrate, which makes its tables too
        if self.args.results:
            install_stored_results(self.project)  # its app's tables, on SQLite too
        if self.postgres is not None or self.args.results:
            self.project.manage("migrate", "--verbosity", "0")
        if accounts:
            made = f"Account(pk=i, name=f'account {{i}}') for i in range(1, {accounts + 1})"
            self.project.manage("shell", "-c", f"from shop.models import Account; Account.objects.bulk_create({made})")
        shutil.copy(PRODUCER, self.project.directory / PRODUCER_NAME)
        self.cpu_groups = {"worker": [], "redis": [self.redis.process.pid]}
        if self.postgres is not None:
            postmaster = self.postgres.directory / "data" / "postmaster.pid"
            self.cpu_groups["postgres"] = [int(postmaster.read_text().split()[0])]
        if self.peer is not None:
            self.cpu_groups[self.peer.name] = []  # its worker's, during its rounds

    def use(self, workload: Workload) -> bool:
        """The worker of ``workload``: the one running if it has its concurrency, else a new one in its place
        (the old one stopped first). Whether it is new."""
        if self.worker is not None and self.worker.concurrency == workload.concurrency:
            return False
        if self.worker is not None:
            self.worker.stop()
        name = "bench" if workload is NOOP else f"bench-{workload.name}"
        self.worker = self.project.worker(name, concurrency=workload.concurrency)
        assert self.worker.process is not None
        self.cpu_groups["worker"] = [self.worker.process.pid]
        return True

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

    def run_round(
        self, workload: Workload, scenario: str, index: int, variant: str, plan: list[tuple[str, int]]
    ) -> ProjectRound:
        peer = self.peer_of(variant)
        if peer is None and self.args.profile and scenario == "many-keys":
            assert self.worker is not None and self.worker.process is not None
            pid, path = self.worker.process.pid, self.args.profile / f"{workload.name}-{variant}-{index}.txt"
            with sampled(pid, path):
                result = self.measure_round(workload, scenario, index, variant, plan)
            self.profiles.append((f"{workload.name} {variant}", path, pid, len(plan), result.cpu))
            return result
        if peer is None:
            return self.measure_round(workload, scenario, index, variant, plan)
        with peer.worker() as pid:  # started and ready before the round's first submission
            self.cpu_groups[variant] = [pid]
            try:
                return self.measure_round(workload, scenario, index, variant, plan)
            finally:
                self.cpu_groups[variant] = []

    def measure_round(
        self, workload: Workload, scenario: str, index: int, variant: str, plan: list[tuple[str, int]]
    ) -> ProjectRound:
        result = ProjectRound(scenario, index, variant, len(plan), workload=workload.name)
        self.history.clear()  # the worker is idle: the last round waited for it (a failed round is the last)
        entries = with_accounts(plan) if workload is REALISTIC else plan
        (self.project.directory / "plan.json").write_text(json.dumps(entries))
        deadline = time.monotonic() + self.args.timeout
        if self.postgres is not None:
            # Statistics as a database in service keeps them: a fresh server's first autovacuum ANALYZE
            # comes a minute in, and a round planned on an empty table's ran a peer's job fetches 8x slower.
            self.database.execute("ANALYZE")
        syncs_before = self.account_syncs() if workload is REALISTIC else 0
        cpu0, main0 = group_cpu_seconds(self.cpu_groups), self.worker_main_cpu_seconds()
        sent = self.produce(workload, variant, result)
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
        result.problems += check_events(events, plan, serial=variant not in UNORDERED)
        if not planned <= self.history.ended:
            missing = len(planned - self.history.ended)
            result.problems.append(f"timed out after {self.args.timeout:.0f} s: {missing} of {len(plan)} not ended")
            return result
        rows = self.rows_of(variant)
        if rows is not None:
            result.settle_seconds = self.wait_recorded(rows, sent["ids"], deadline, result) - sent["first"]
        if scenario == "hot-key" and variant not in UNORDERED:
            result.handoffs_ms = handoffs_ms(events)
        if scenario == "many-keys":
            result.bodies_ms, result.gaps_ms = child_process_ms(events)
        if scenario == "fairness" and sent.get("submitted"):
            result.waits_ms = waits_ms(events, plan, sent["submitted"])
        if workload is REALISTIC:
            result.lost_updates = len(plan) - (self.account_syncs() - syncs_before)
            if result.lost_updates and variant not in UNORDERED:
                result.problems.append(f"{result.lost_updates} account updates lost: a key's tasks ran at once")
        if not self.wait_idle(deadline):
            result.problems.append("the worker was still busy at the round's deadline")
        cpu1, main1 = group_cpu_seconds(self.cpu_groups), self.worker_main_cpu_seconds()
        result.cpu.update(split_worker({name: cpu1[name] - cpu0[name] for name in cpu0}, main1 - main0))
        return result

    def produce(self, workload: Workload, variant: str, result: Round) -> dict | None:
        """The producer's report ({"first", "last", "cpu", "ids", "submitted"}), or None with the round's
        problem noted."""
        peer = self.peer_of(variant)
        if peer is not None:
            command = [sys.executable, peer.script, variant, "plan.json"]
        else:
            command = [sys.executable, PRODUCER_NAME, variant, "plan.json", workload.name]
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

    def account_syncs(self) -> int:
        """Every account's count of syncs, summed."""
        return self.database.value("SELECT COALESCE(SUM(syncs), 0) FROM shop_account")

    def rows_of(self, variant: str) -> Rows | None:
        """Where ``variant``'s tasks leave a row each in the project's database: none for plain Celery's."""
        from django_keyed_queue.records.statuses import TERMINAL_STATUSES

        peer = self.peer_of(variant)
        if peer is not None:
            status_query = peer.status_query

            def jobs(ids: list[str]) -> Counter:
                return with_missing(Counter(dict(self.database.rows(status_query, [ids]))), ids)

            return Rows("jobs", jobs, peer.terminal_statuses, "succeeded")
        if variant == "results":
            results = self.database.statuses
            return Rows("stored results", lambda ids: results(STORED_RESULTS, ids), RESULT_TERMINAL, "SUCCESS")
        if variant in UNORDERED:
            return None
        records = self.database.statuses
        return Rows("records", lambda ids: records(KEYED_RECORDS, ids), TERMINAL_STATUSES, "succeeded")

    def wait_recorded(self, rows: Rows, ids: list, deadline: float, result: Round) -> float:
        """time.time() when the row of every task of ``ids`` was terminal (or at the deadline, with the problem
        noted); a problem too unless each one ended succeeded."""
        while True:
            counts = rows.statuses(ids)
            if sum(counts[s] for s in rows.terminal) == len(ids) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        settled = time.time()
        if counts != Counter({rows.succeeded: len(ids)}):
            result.problems.append(f"{rows.noun} not all {rows.succeeded}: {dict(counts)}")
        return settled

    def worker_main_cpu_seconds(self) -> float:
        return own_cpu_seconds(self.cpu_groups["worker"][0])

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
        """Lines of the workers' logs at WARNING or worse, and tracebacks."""
        pattern = re.compile(r"WARNING|ERROR|CRITICAL|Traceback|database is locked")
        lines = []
        for worker in self.project.workers:
            if worker.log_path.exists():
                lines += [f"{worker.name}: {line}" for line in worker.log().splitlines() if pattern.search(line)]
        if self.peer is not None:
            lines += self.peer.log_problems()
        return lines


def install_stored_results(project: UserProject) -> None:
    """django-celery-results as its docs say, into the built project (before its ``migrate``): its app, and
    ``django-db`` as the project's result backend; results ignored unless a task says otherwise (see above)."""
    with open(project.directory / "mysite" / "settings.py", "a") as settings:
        settings.write(
            '\nINSTALLED_APPS += ["django_celery_results"]\n'
            'CELERY_RESULT_BACKEND = "django-db"\n'
            "CELERY_TASK_IGNORE_RESULT = True\n"
        )
