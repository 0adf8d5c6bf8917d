"""Throughput of keyed serial tasks against plain Celery tasks, on the same real workers, in one run.

    python -m bench.throughput [--tasks 2000 --keys 500 --hot-tasks 400 --workers 2 --concurrency 2 --rounds 3]
                               [--database sqlite|sqlite-wal|postgresql] [--gate-on-broker] [--prefetch 4]

Starts a broker redis-server, a separate gate redis-server (or one for both), the records' database
(a SQLite file, or a PostgreSQL server with durable commits) and real prefork workers in a temp dir,
then alternates plain and keyed rounds of two scenarios:

- many keys: ``--tasks`` tasks spread over ``--keys`` keys (a seeded shuffle, the same for both variants);
- one hot key: ``--hot-tasks`` tasks all on one key.

On many keys a third variant, ``bulk``, submits the same tasks with one ``apply_async_many`` call
(one gate round trip per 500), against plain Celery's loop of ``apply_async``.

Both variants run the same instrumented no-op (``plain_step`` / ``step`` with duration 0), which logs a
start and an end event to a Redis list. Throughput = tasks / (last end event - first submission), on this
machine's clock. Records stay on (the default). Exits 1 if a task was lost, ran twice, broke the key's
order or exclusion, or a round timed out. See docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testproject.history_checks import check_serial, never_ended, start_counts

from .harness import DATABASES, Cluster, CommandStats, Timers, cpu_seconds
from .report import print_ending, print_profile, print_rounds, print_summary, summarize

#: A queue no worker consumes: submissions measured on their own land here and are deleted.
PARKED_QUEUE = "bench-not-consumed"


@dataclass
class Round:
    scenario: str
    index: int
    variant: str
    tasks: int
    submit_seconds: float = 0.0
    wall_seconds: float = 0.0
    settle_seconds: float | None = None
    gate: Counter = field(default_factory=Counter)
    broker: Counter = field(default_factory=Counter)
    handoffs_ms: list[float] = field(default_factory=list)
    #: CPU seconds used during the round, per process group.
    cpu: dict[str, float] = field(default_factory=dict)
    profile: dict[str, tuple[int, float]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def throughput(self) -> float:
        return self.tasks / self.wall_seconds if self.wall_seconds else 0.0


class Bench:
    def __init__(self, cluster: Cluster, args: argparse.Namespace) -> None:
        import redis

        from testproject.demo import tasks

        self.args = args
        self.tasks = {"plain": tasks.plain_step, "keyed": tasks.step}
        self.history = redis.Redis.from_url(f"{cluster.broker_url}/3")
        self.broker = redis.Redis.from_url(f"{cluster.broker_url}/1")
        self.solo = 0
        self.gate_stats = CommandStats(redis.Redis.from_url(f"{cluster.gate_url}/0"))
        self.broker_stats = CommandStats(redis.Redis.from_url(f"{cluster.broker_url}/0"))
        self.own_calls: Counter = Counter()  # commands this process sends the broker server to watch
        self.cpu_groups = {"workers": [w.process.pid for w in cluster.workers]}
        if len(cluster.servers) == 1:  # --gate-on-broker: its commands are counted as the gate's and the broker's
            self.cpu_groups["broker and gate redis"] = [cluster.servers[0].process.pid]
        else:
            self.cpu_groups["broker redis"] = [cluster.servers[0].process.pid]
            self.cpu_groups["gate redis"] = [cluster.servers[1].process.pid]
        self.timers = Timers() if args.profile else None
        if self.timers:
            self._instrument()

    def _instrument(self) -> None:
        from celery.app.task import Task
        from django.db.backends.base.base import BaseDatabaseWrapper
        from django.db.transaction import Atomic

        from django_keyed_queue.gate import Gate
        from django_keyed_queue.keyed_task.task import KeyedSerialTask
        from django_keyed_queue.messaging.message import TaskMessage
        from django_keyed_queue.producer import submit
        from django_keyed_queue.records.manager import KeyedTaskManager

        t = self.timers
        t.wrap(KeyedSerialTask, "apply_async", "keyed apply_async (total)")
        t.wrap(Task, "apply_async", "celery apply_async (broker publish)")
        t.wrap(Gate, "submit", "gate submit script")
        t.wrap(KeyedTaskManager, "insert_submission", "records INSERT")
        t.wrap(BaseDatabaseWrapper, "commit", "records COMMIT")
        t.wrap(Atomic, "__enter__", "transaction.atomic enter (BEGIN IMMEDIATE: waits for the SQLite write lock)")
        t.wrap(KeyedSerialTask, "key_for", "key_for")
        t.wrap(TaskMessage, "encode", "TaskMessage.encode")
        t.wrap(submit, "describe_arguments", "describe_arguments")

    def submit_cost(self, variant: str, count: int) -> float:
        """Microseconds per submission while the workers idle: every task on a new key, published to a queue
        no worker reads, so the gate grants each one at once (as in the many-keys rounds) and nothing runs."""
        task = self.tasks[variant]
        t0 = time.perf_counter()
        for i in range(count):
            task.apply_async((f"solo-{variant}-{self.solo}-{i}", i, 0.0), queue=PARKED_QUEUE)
        spent = time.perf_counter() - t0
        self.solo += 1
        self.broker.delete(PARKED_QUEUE)  # the messages nobody will run
        return 1e6 * spent / count

    def run_round(self, scenario: str, index: int, variant: str, plan: list[tuple[str, int]]) -> Round:
        from celery import chain

        from django_keyed_queue.records.models import KeyedTask
        from django_keyed_queue.records.statuses import TERMINAL_STATUSES, Status

        result = Round(scenario, index, variant, len(plan))
        self.history.delete("testproject:history")
        if self.timers:
            self.timers.reset()
        gate0, broker0 = self.gate_stats.snapshot(), self.broker_stats.snapshot()
        self.own_calls.clear()
        cpu0 = {"producer": time.process_time(), **cpu_seconds(self.cpu_groups)}

        t0 = time.time()
        if variant == "chain":
            # Plain Celery's own serial handoff: each task's worker publishes the next message.
            chain(*[self.tasks["plain"].si(key, n, 0.0) for key, n in plan]).apply_async()
            ids = []
        elif variant == "bulk":
            ids = [r.id for r in self.tasks["keyed"].apply_async_many([(key, n, 0.0) for key, n in plan])]
        else:
            ids = [self.tasks[variant].apply_async((key, n, 0.0)).id for key, n in plan]
        t_submitted = time.time()
        result.submit_seconds = t_submitted - t0

        expected = 2 * len(plan)
        deadline = time.monotonic() + self.args.timeout
        while True:
            self.own_calls["llen"] += 1
            if self.history.llen("testproject:history") >= expected:
                break
            if time.monotonic() > deadline:
                break
            time.sleep(0.02)
        t_seen = time.time()
        self.own_calls["lrange"] += 1
        events = [json.loads(raw) for raw in self.history.lrange("testproject:history", 0, -1)]
        ends = [e["t"] for e in events if e["event"] == "end"]
        result.wall_seconds = (max(ends) if ends else t_seen) - t0
        result.problems += check_events(events, plan, serial=variant != "plain")
        if len(events) < expected:
            result.problems.append(f"timed out after {self.args.timeout:.0f}s: {len(ends)} of {len(plan)} finished")

        if variant in ("keyed", "bulk"):
            deadline = time.monotonic() + self.args.timeout
            while True:
                done = KeyedTask.objects.filter(task_id__in=ids, status__in=TERMINAL_STATUSES).count()
                if done >= len(ids) or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            result.settle_seconds = time.time() - t0
            statuses = Counter(KeyedTask.objects.filter(task_id__in=ids).values_list("status", flat=True))
            if statuses != Counter({Status.SUCCEEDED: len(ids)}):
                result.problems.append(f"records not all succeeded: {dict(statuses)}")
        time.sleep(0.3)  # let the last finish scripts and result writes land before counting
        cpu1 = {"producer": time.process_time(), **cpu_seconds(self.cpu_groups)}
        result.cpu = {name: cpu1[name] - cpu0[name] for name in cpu0}
        result.gate = CommandStats.delta(gate0, self.gate_stats.snapshot())
        broker = CommandStats.delta(broker0, self.broker_stats.snapshot())
        broker.subtract(self.own_calls)
        result.broker = +broker
        if scenario == "hot-key" and variant != "plain":
            result.handoffs_ms = handoffs_ms(events)
        if self.timers:
            result.profile = {k: (self.timers.calls[k], self.timers.seconds[k]) for k in self.timers.seconds}
        return result


def check_events(events: list[dict], plan: list[tuple[str, int]], serial: bool) -> list[str]:
    """Every planned task started and ended once; keyed tasks ran one at a time per key, in order
    (testproject/history_checks.py)."""
    problems = []
    planned = set(plan)
    missing = never_ended(events, planned, ident=key_and_n)
    twice = [task for task, count in start_counts(events, planned, ident=key_and_n).items() if count > 1]
    if missing:
        problems.append(f"{len(missing)} tasks never finished (lost?), e.g. {missing[:3]}")
    if twice:
        problems.append(f"{len(twice)} tasks ran more than once, e.g. {sorted(twice)[:3]}")
    if serial:
        problems += check_serial(events).problems
    return problems[:10]


def key_and_n(event: Mapping[str, Any]) -> tuple[str, int]:
    return event["key"], event["n"]


def handoffs_ms(events: list[dict]) -> list[float]:
    """Per key: the end of task n to the start of task n+1, in ms (event timestamps, one machine clock)."""
    end_t, start_t = {}, {}
    for e in events:
        (end_t if e["event"] == "end" else start_t)[(e["key"], e["n"])] = e["t"]
    return [(start_t[(k, n + 1)] - t) * 1000 for (k, n), t in end_t.items() if (k, n + 1) in start_t]


def child_process_ms(events: list[dict]) -> tuple[list[float], list[float]]:
    """Where a child process's time goes: each task's body (its start to its end), and each gap between the
    end of one task and the start of the next in the same process (the worker's own work around a task:
    Celery's, and a keyed task's gate calls and records), in ms."""
    bodies, gaps, by_process = [], [], defaultdict(list)
    started = {}
    for e in events:
        by_process[e["pid"]].append(e)
        if e["event"] == "start":
            started[e["id"]] = e["t"]
        elif e["id"] in started:
            bodies.append((e["t"] - started[e["id"]]) * 1000)
    for process_events in by_process.values():
        process_events.sort(key=lambda e: e["t"])
        pairs = itertools.pairwise(process_events)
        gaps += [(b["t"] - a["t"]) * 1000 for a, b in pairs if a["event"] == "end" and b["event"] == "start"]
    return bodies, gaps


def many_keys_plan(tasks: int, keys: int, seed: int = 7) -> list[tuple[str, int]]:
    """``tasks`` tasks over ``keys`` keys, shuffled; n counts a key's tasks in submission order."""
    order = [f"acct-{i % keys}" for i in range(tasks)]
    random.Random(seed).shuffle(order)
    seen: Counter = Counter()
    plan = []
    for key in order:
        plan.append((key, seen[key]))
        seen[key] += 1
    return plan


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=2000, help="tasks per many-keys round (0 skips)")
    parser.add_argument("--keys", type=int, default=500, help="keys of the many-keys rounds")
    parser.add_argument("--hot-tasks", type=int, default=400, help="tasks per hot-key round (0 skips)")
    parser.add_argument(
        "--submit-tasks", type=int, default=500, help="submissions per round of the idle-worker submit cost (0 skips)"
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3, help="plain/keyed pairs per scenario")
    parser.add_argument(
        "--no-chain", dest="chain", action="store_false", help="skip the plain Celery chain reference on the hot key"
    )
    parser.add_argument(
        "--no-bulk", dest="bulk", action="store_false", help="skip the bulk submission (apply_async_many) on many keys"
    )
    parser.add_argument("--timeout", type=float, default=120, help="seconds a round may take")
    parser.add_argument("--profile", action="store_true", help="time the submit path in this process")
    parser.add_argument("--plot", type=Path, help="write a PNG of the figures here (needs matplotlib)")
    parser.add_argument("--json", type=Path, help="write the raw figures here")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs, database)")
    parser.add_argument(
        "--database",
        choices=DATABASES,
        default="sqlite-wal",
        help="the records' database: SQLite as startproject makes it, SQLite in WAL mode, or PostgreSQL",
    )
    parser.add_argument(
        "--gate-on-broker", action="store_true", help="one redis-server for the broker and the gate (the common set-up)"
    )
    parser.add_argument("--prefetch", type=int, default=4, help="worker_prefetch_multiplier (Celery's default: 4)")
    args = parser.parse_args(argv)

    started = time.monotonic()
    cluster = Cluster(
        args.workers,
        args.concurrency,
        keep=args.keep,
        database=args.database,
        gate_on_broker=args.gate_on_broker,
        prefetch=args.prefetch,
    )
    rounds: list[Round] = []
    submit_us: dict[str, list[float]] = {}
    failed = False
    log_problems: list[str] = []
    try:
        cluster.start()
        print(
            f"{args.workers} workers x prefork {args.concurrency}, prefetch {args.prefetch}, {os.cpu_count()} CPUs, "
            f"records on ({args.database}), gate {'on the broker' if args.gate_on_broker else 'on its own'} "
            f"redis-server; setup {time.monotonic() - started:.1f} s; "
            f"load average {os.getloadavg()[0]:.2f}"
        )
        bench = Bench(cluster, args)
        warm = many_keys_plan(100, 20, seed=1)
        for variant in ("plain", "keyed"):
            warmup = bench.run_round("warm-up", 0, variant, warm)
            if warmup.problems:
                print(f"warm-up {variant}: {warmup.problems}", file=sys.stderr)
                failed = True
        submit_us: dict[str, list[float]] = {"plain": [], "keyed": []}
        for _ in range(args.rounds if args.submit_tasks else 0):
            for variant in submit_us:
                submit_us[variant].append(bench.submit_cost(variant, args.submit_tasks))
        many = ("plain", "keyed", "bulk") if args.bulk else ("plain", "keyed")
        scenarios = [("many-keys", many_keys_plan(args.tasks, args.keys), many)] if args.tasks else []
        if args.hot_tasks:
            hot = [("hot", n) for n in range(args.hot_tasks)]
            scenarios.append(("hot-key", hot, ("plain", "keyed", "chain") if args.chain else ("plain", "keyed")))
        for scenario, plan, variants in scenarios:
            for index in range(1, args.rounds + 1):
                for variant in variants:
                    if failed:
                        break
                    r = bench.run_round(scenario, index, variant, plan)
                    rounds.append(r)
                    print(f"  {scenario} round {index} {variant}: {r.throughput:.0f} tasks/s", flush=True)
                    if r.problems:
                        failed = True
                        for problem in r.problems:
                            print(f"FAILED {scenario} round {index} {variant}: {problem}", file=sys.stderr)
    except BaseException:
        failed = True
        raise
    finally:
        log_problems = cluster.worker_log_problems()
        cluster.stop(failed=failed)

    print(f"\nload average at the end {os.getloadavg()[0]:.2f}\n")
    print_rounds(rounds)
    summary = summarize(rounds)
    print_summary(rounds, summary, submit_us)
    if args.profile:
        print_profile(rounds)
    print_ending(log_problems, time.monotonic() - started, failed=failed)

    if args.json:
        rows = [{k: v for k, v in r.__dict__.items()} for r in rounds]
        args.json.write_text(json.dumps({"summary": summary, "rounds": rows}, default=dict, indent=1))
    if args.plot and rounds:
        from .plot import plot

        plot(rounds, summary, args.plot)
        print(f"plot written to {args.plot}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
