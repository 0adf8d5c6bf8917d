"""What ``python -m bench.userproject`` runs: its workloads, and every round in order."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from .fairness import fairness_plan
from .report import CPU_EXTRA_TARGET_MS, REALISTIC_TARGETS, TARGETS
from .throughput import Round, many_keys_plan


@dataclass(frozen=True)
class Workload:
    name: str
    concurrency: int
    describe: str
    targets: dict[str, float]
    cpu_extra_target: float | None


NOOP = Workload("noop", 2, "no-op tasks", TARGETS, CPU_EXTRA_TARGET_MS)
REALISTIC = Workload(
    "realistic", 8, "each task reads and updates one Account row, then sleeps 10 ms", REALISTIC_TARGETS, None
)
WORKLOADS = {w.name: w for w in (NOOP, REALISTIC)}


@dataclass
class ProjectRound(Round):
    workload: str = NOOP.name
    #: Fairness rounds: each one-task key's wait, start less submission (ms).
    waits_ms: list[float] = field(default_factory=list)
    #: Realistic rounds: the account updates a concurrent task of the same account overwrote.
    lost_updates: int | None = None
    #: Many-keys rounds: each task's body, and each gap between two tasks of one child process (ms).
    bodies_ms: list[float] = field(default_factory=list)
    gaps_ms: list[float] = field(default_factory=list)


def with_accounts(plan: list[tuple[str, int]]) -> list[tuple[str, int, int]]:
    """Each task of ``plan`` with its key's account: accounts 1, 2... in the order the keys first come."""
    accounts: dict[str, int] = {}
    return [(key, n, accounts.setdefault(key, len(accounts) + 1)) for key, n in plan]


Schedule = list[tuple[Workload, str, int, str, list[tuple[str, int]]]]


def schedule(args: argparse.Namespace) -> Schedule:
    """Every round, in order: per workload, the warm-up, then each scenario's rounds, the variants alternating."""
    rounds: Schedule = []
    indices = range(1, args.rounds + 1)
    results = ("results",) if args.results else ()
    for workload in (NOOP, REALISTIC) if args.workload == "both" else (WORKLOADS[args.workload],):
        peer = (args.peer,) if args.peer and workload is NOOP else ()
        pooled = ("pooled",) if args.pooled and workload is NOOP else ()
        if args.warm_up:
            warm = many_keys_plan(args.warm_up, max(1, args.warm_up // 5), seed=1)
            rounds += [(workload, "warm-up", 0, v, warm) for v in ("plain", "keyed", *pooled, *results, *peer)]
        if args.tasks:
            plan = many_keys_plan(args.tasks, args.keys)
            bulk = ("bulk",) if args.bulk and workload is NOOP else ()
            variants = ("plain", "keyed", *bulk, *pooled, *results, *peer)
            rounds += [(workload, "many-keys", i, v, plan) for i in indices for v in variants]
        if args.hot_tasks and workload is NOOP:
            hot = [("hot", n) for n in range(args.hot_tasks)]
            rounds += [(workload, "hot-key", i, v, hot) for i in indices for v in ("plain", "keyed", *peer)]
        hot_tasks = args.fairness_hot_tasks if workload is NOOP else args.realistic_hot_tasks
        if args.fairness and args.fairness_keys:  # with no hot-key tasks: the one-task keys alone, for reference
            plan = fairness_plan(hot_tasks, args.fairness_keys)
            rounds += [(workload, "fairness", i, v, plan) for i in indices for v in ("plain", "keyed")]
    return rounds
