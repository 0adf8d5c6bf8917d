"""Throughput of keyed serial tasks against plain Celery tasks in a project made exactly as a user makes one.

    python -m bench.userproject [--tasks 2000 --keys 500 --hot-tasks 400 --rounds 3]
                                [--workload noop|realistic|both] [--no-bulk] [--no-pooled] [--no-results]
                                [--no-fairness]
                                [--fairness-keys 200 --fairness-hot-tasks 5000 --realistic-hot-tasks 1000]
                                [--database sqlite|sqlite-wal|postgresql] [--peer procrastinate]
                                [--setting NAME=JSON ...] [--json PATH] [--profile DIR] [--keep]

The project is testproject/userproject/project.py's: ``django-admin startproject mysite``, ``startapp shop``,
the README's install blocks (Celery's documented Django layout, Celery's default settings, ONE redis-server for
the broker and the gate), plus ``DEBUG = False``. Its records' database is SQLite as ``startproject`` makes
it (``--database sqlite``, the default), the same file in WAL mode with ``synchronous=NORMAL`` (an
``init_command``), or a PostgreSQL server with durable commits. One worker runs as Celery's docs say,
``celery -A mysite worker -l INFO``, at its workload's concurrency. Every task logs a start and an end line,
with its time, to ``history.jsonl`` in the project.

Two workloads, one after the other (``--workload both``, the default), each on its own worker:

- ``noop``: the project's ``shop.tasks.step`` (keyed, ``key="{key}"``) and ``plain_step`` (a plain
  ``@shared_task``) with ``seconds=0``, on a worker with ``-c 2``;
- ``realistic``, tasks as users write them: ``sync_step`` and ``plain_sync_step`` read one row of the user's
  own model (``Account.objects.get(pk=...)``), change it and ``save(update_fields=...)``, then sleep 10 ms as
  on an HTTP call; one account per key, on a worker with ``-c 8`` (the worker of ``noop`` is stopped first).
  Its rounds also count the account updates lost to two tasks of one account at once (none may be lost keyed).

A producer, bench/userproject_produce.py copied into the project and run there with its environment,
submits as fast as it can and prints the time of its first submission, of its last, and of each. Each
workload's rounds alternate variants (after a small warm-up of each), in up to three scenarios:

- many keys: ``--tasks`` tasks over ``--keys`` keys in a seeded shuffle, each key's tasks numbered
  n = 0, 1, 2...; plain, keyed, and (noop) ``bulk``, the same calls in one ``step.apply_async_many``, and
  ``pooled`` (noop; ``--no-pooled`` leaves it out): ``roomy_step``, ``step`` in pool "roomy" of the
  project's ``KEYED_QUEUE_POOLS``, whose limit of 1000 it never reaches, so its rounds cost what keyed's do
  plus what a pool costs: a slot asked for at each start and given back at each end (see
  django_keyed_queue/gate/pools.py), and no start made for it by the finish before it (a pool is asked
  first). Checked as keyed (every task once, each key's in order, each record succeeded); the ratios add
  pooled/plain and pooled/keyed, and the CPU per task pooled over keyed;
- one hot key (noop): ``--hot-tasks`` tasks on one key; the keyed rounds' handoffs (end of task n to start
  of n+1) are taken from the history's times;
- fairness (bench/fairness.py): ``--fairness-hot-tasks`` tasks of one key submitted first (the realistic
  workload's ``--realistic-hot-tasks``, fewer: its keyed hot key runs 10+ ms a task, one at a time), then
  ``--fairness-keys`` keys with one task each, right after; plain and keyed. It reports the one-task keys'
  wait, their start less their submission, p50 and p99; the round lasts until every task ended. With no
  hot-key tasks (``--fairness-hot-tasks 0 --realistic-hot-tasks 0``) the one-task keys run alone: the wait
  they have on this worker with nothing ahead of them, a reference.

The second baseline, ``results`` (on by default; ``--no-results`` leaves it out and the project as
before), is plain Celery as Django users run it to see their tasks: django-celery-results in the project
(``INSTALLED_APPS``, its migrations), ``CELERY_RESULT_BACKEND = "django-db"``, storing each result in the same
database. Its rounds run beside plain and keyed on many keys, in both workloads, on the same worker. How:
the backend is the project's, app-wide, as a user configures it, with ``CELERY_TASK_IGNORE_RESULT = True``;
the ``results`` rounds submit ``plain_step_stored`` / ``plain_sync_step_stored``, the plain tasks' bodies
declared ``ignore_result=False``. Plain and keyed tasks then store nothing, as under Celery's default
(disabled) backend: with results ignored Celery neither calls the backend on submission nor stores after a
run, so they do what they do for a user with default settings, while all three variants share one worker
and alternate round by round (a worker restarted between variants would give each a cold start, and the
machine's drift between them). After each ``results`` round its rows are counted: each task's must exist
with ``SUCCESS``.

With ``--database postgresql --peer procrastinate`` the noop workload's many-keys and hot-key scenarios also
have procrastinate rounds, a peer (bench/peer_procrastinate.py): the same task body, plan and checks, each
task deferred with ``lock=<its key>``, one procrastinate worker at the Celery worker's concurrency, on the same
PostgreSQL database; the ratios add keyed/procrastinate.

Throughput = tasks / (last end - first submission), on this machine's clock. After each round the bench waits
until every task ended, the keyed records (or the stored results, or the peer's jobs) are terminal and the
worker is idle; the next round empties the history first (the last round's is kept, with ``--keep``).
Exits 1 if a task was lost or ran twice, a keyed or peer round broke its keys' order or exclusion (read from
the order of the history's lines, appended across processes) or lost an account's update, a keyed record, a
stored result or a peer's job did not end succeeded, or a round timed out.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from importlib.metadata import version
from pathlib import Path

from .harness import DATABASES
from .report import DATABASE_CPU_EXTRA_TARGET_MS, DATABASE_TARGETS, print_ending
from .userproject_bench import PEERS, Bench
from .userproject_plan import NOOP, REALISTIC, WORKLOADS, ProjectRound, schedule
from .userproject_profile import report as profile_report
from .userproject_report import report_workload


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=2000, help="tasks per many-keys round (0 skips)")
    parser.add_argument("--keys", type=int, default=500, help="keys of the many-keys rounds")
    parser.add_argument("--hot-tasks", type=int, default=400, help="tasks per hot-key round, noop (0 skips)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each variant per scenario")
    parser.add_argument("--warm-up", type=int, default=100, help="tasks of the unmeasured first rounds (0 skips)")
    parser.add_argument("--no-bulk", dest="bulk", action="store_false", help="skip apply_async_many on many keys")
    parser.add_argument(
        "--no-pooled", dest="pooled", action="store_false", help="skip the keyed task of a pool with room, many keys"
    )
    parser.add_argument("--workload", choices=(*WORKLOADS, "both"), default="both", help="noop, realistic, or both")
    parser.add_argument(
        "--no-results",
        dest="results",
        action="store_false",
        help="skip the rounds of plain tasks storing their results (django-celery-results), and its settings",
    )
    parser.add_argument("--no-fairness", dest="fairness", action="store_false", help="skip the fairness rounds")
    parser.add_argument("--fairness-keys", type=int, default=200, help="one-task keys of a fairness round")
    parser.add_argument("--fairness-hot-tasks", type=int, default=5000, help="the hot key's tasks, noop fairness")
    parser.add_argument("--realistic-hot-tasks", type=int, default=1000, help="the hot key's tasks, realistic fairness")
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
        help="add a peer's rounds to each noop scenario: procrastinate, each task locked by its key (PostgreSQL only)",
    )
    parser.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="NAME=JSON",
        help="a setting added to the project, its value in JSON (what a setting changes: KEYED_QUEUE_...=1.0); "
        "none by default, the project as a user makes it",
    )
    parser.add_argument("--json", type=Path, help="write the raw figures here")
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="sample the worker's processes with py-spy in each many-keys round, into DIR, and print the CPU per "
        "task of each piece (bench/userproject_profile.py); a profiled run's throughput is not a figure",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (project, logs, history, database)")
    args = parser.parse_args(argv)
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    args.settings = {}
    for setting in args.setting:
        name, _, value = setting.partition("=")
        try:
            args.settings[name] = json.loads(value)
        except ValueError:
            parser.error(f'--setting {setting!r}: give NAME=VALUE, the value in JSON (1.0, true, "text")')
        if not name.isidentifier() or not name.isupper():
            parser.error(f"--setting {setting!r}: {name!r} is not a settings name (upper case, like KEYED_QUEUE_...)")
    if args.peer and args.database != "postgresql":
        parser.error(f"--peer {args.peer} runs on PostgreSQL: add --database postgresql")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    directory = Path(tempfile.mkdtemp(prefix="keyed-queue-bench-userproject-"))
    bench = Bench(args, directory)
    plan = schedule(args)
    accounts = max((len({key for key, _ in keys}) for w, *_, keys in plan if w is REALISTIC), default=0)
    rounds: list[ProjectRound] = []
    log_problems: list[str] = []
    failed = False
    try:
        bench.start(accounts)
        first = plan[0][0] if plan else NOOP
        bench.use(first)
        print(
            f"user project (startproject, README install blocks, Celery defaults, DEBUG = False), one redis-server "
            f"for broker and gate, records on {args.database}; 1 worker x prefork {first.concurrency}, "
            f"{os.cpu_count()} CPUs; setup {time.monotonic() - started:.1f} s; load average {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        if args.settings:
            print(f"settings added: {', '.join(f'{name} = {value!r}' for name, value in args.settings.items())}")
        if bench.peer is not None:
            print(f"peer: {bench.peer.describe()}; its jobs on the same database", flush=True)
        if args.results:
            print(
                f"results: plain tasks storing their results with django-celery-results "
                f"{version('django-celery-results')} (CELERY_RESULT_BACKEND = 'django-db'), in the same database",
                flush=True,
            )
        if any(variant == "pooled" for *_, variant, _ in plan):
            print("pooled: shop.tasks.roomy_step, step in pool 'roomy' (limit 1000: never full here)", flush=True)
        print(f"{first.name} workload: {first.describe}", flush=True)
        for workload, scenario, index, variant, round_plan in plan:
            if bench.use(workload):
                print(
                    f"{workload.name} workload: {workload.describe}; 1 worker x prefork {workload.concurrency} in "
                    f"place of the last; load average {os.getloadavg()[0]:.2f}",
                    flush=True,
                )
            r = bench.run_round(workload, scenario, index, variant, round_plan)
            print(f"  {scenario} round {index} {variant}: {r.throughput:.0f} tasks/s", flush=True)
            for problem in r.problems:
                print(f"FAILED {workload.name} {scenario} round {index} {variant}: {problem}", file=sys.stderr)
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

    print(f"\nload average at the end {os.getloadavg()[0]:.2f}")
    summary: dict = {}
    for workload in WORKLOADS.values():
        of_workload = [r for r in rounds if r.workload == workload.name]
        if of_workload:
            print(f"\n{workload.name} workload ({workload.describe}), 1 worker x prefork {workload.concurrency}:\n")
            targets, cpu_extra_target = workload.targets, workload.cpu_extra_target
            if workload is NOOP:
                targets = {**targets, **DATABASE_TARGETS.get(args.database, {})}
                cpu_extra_target = DATABASE_CPU_EXTRA_TARGET_MS.get(args.database, cpu_extra_target)
            figures = report_workload(of_workload, targets, cpu_extra_target)
            if workload is NOOP:  # at the top, where the runs before workloads had them (bench.plot reads them)
                summary.update(figures)
            else:
                summary[workload.name] = figures
    if args.profile:
        profile_report(bench.profiles)
    print_ending(log_problems, time.monotonic() - started, failed=failed)

    if args.json:
        rows = [{**asdict(r), "throughput": r.throughput} for r in rounds]
        figures = {"args": vars(args), "summary": summary, "rounds": rows, "worker_log_problems": log_problems}
        args.json.write_text(json.dumps(figures, default=str, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
