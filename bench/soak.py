"""Crash soak: randomized rounds of keyed tasks on real workers, one injected fault per round, every guarantee checked.

    python -m bench.soak [--rounds 20 --keys 12 --tasks-per-round 36 --seed S --faults KINDS --keep]

Starts a broker redis-server (broker db 1, history db 3), a gate redis-server, a SQLite file and 3 prefork
workers (concurrency 2) in a temp dir, with short gate timings (lease 1.5 s, dispatch timeout 3 s, reaper
every 0.3 s) in the workers and in this process. Each round submits ``lingering_step`` tasks over fresh keys
(some linger a few seconds on their first attempt), injects one fault, waits for every record to be
terminal, then checks exclusion, order, one successful end per task, the records and the gate. Faults:

- kill-pool     SIGKILL a child process running a lingering task;
- kill-worker   SIGKILL a whole worker (its process group) with a lingering task, then start a replacement;
- stall         SIGSTOP a child process running a lingering task past its lease, then SIGCONT;
- lost-message  delete granted task messages sitting in the broker queue;
- redis-restart SIGKILL the redis-server, wait 1 s, start it again on its port and directory (opt-in: with it
                the broker, the gate and the history share that one redis-server, with every write fsynced).

Recovery time: from the fault to the next start on the victim's key (lost message: from the deletion to the
start of that task; redis-restart: "resume", from Redis answering again to the next start of each key that had
tasks waiting). Exits 1 on any violation. See docs/soak.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from testproject.servers import AOF_ALWAYS

from .harness import Cluster, proc_stat
from .soak_checks import (
    BOUNDS,
    DEFAULT_FAULTS,
    FAULTS,
    TIMINGS,
    Record,
    Task,
    Verdict,
    check_round,
    log_problems,
    next_start,
    pair_runs,
    print_summary,
    round_line,
)
from .soak_faults import INJECT, Fault

WORKERS, CONCURRENCY = 3, 2

#: Lingers of first attempts (seconds), and how likely a task lingers (first task of a key, the others).
LINGER, P_LINGER_FIRST, P_LINGER = (1.5, 3.0), 0.4, 0.1


@dataclass
class RoundResult:
    index: int
    fault: Fault
    tasks: int
    seconds: float
    verdict: Verdict


def alive(pid: int) -> bool:
    fields = proc_stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


class Soak:
    def __init__(self, cluster: Cluster, args: argparse.Namespace, seed: int) -> None:
        import redis

        from testproject.demo.history import HISTORY

        self.cluster, self.args = cluster, args
        self.rng = random.Random(seed)
        self.env = {f"KEYED_QUEUE_{name}": str(value) for name, value in TIMINGS.items()}
        self.history_key = HISTORY
        self.history = redis.Redis.from_url(f"{cluster.broker_url}/3")
        self.broker = redis.Redis.from_url(f"{cluster.broker_url}/1")
        self.events: list[dict] = []
        self.live: list = []
        self.started_workers = 0
        self.stopped: set[int] = set()
        self.stop_lock = threading.Lock()
        self.watchdog: threading.Timer | None = None

    # -- processes ----------------------------------------------------------

    def start_worker(self) -> None:
        from testproject.servers import Worker

        self.started_workers += 1
        worker = Worker(
            f"soak{self.started_workers}", self.cluster.dir / "logs", concurrency=CONCURRENCY, extra_env=self.env
        )
        self.cluster.workers.append(worker)  # Cluster.stop stops it whatever happens
        worker.start(timeout=60)
        self.live.append(worker)

    def owner(self, pid: int):
        from testproject.servers import parent_pid

        try:
            parent = parent_pid(pid)
        except (OSError, ValueError, IndexError):
            return None
        return next((w for w in self.live if w.process.pid == parent and w.process.poll() is None), None)

    def stop(self, pids: list[int]) -> None:
        with self.stop_lock:
            self.stopped.update(pids)
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)

    def resume(self, pids: list[int] | None = None) -> None:
        """SIGCONT these stopped processes (all of them by default)."""
        with self.stop_lock:
            chosen = set(self.stopped if pids is None else pids) & self.stopped
            self.stopped -= chosen
        for pid in chosen:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass

    # -- history ------------------------------------------------------------

    def refresh(self) -> list[dict]:
        fresh = self.history.lrange(self.history_key, len(self.events), -1)
        self.events += [json.loads(raw) for raw in fresh]
        return self.events

    def running(self, tasks: dict[tuple, Task], start: int) -> list:
        """Runs of this round now going on in a live child process of one of our workers."""
        runs, _ = pair_runs(self.refresh(), {k for k, _ in tasks}, start)
        return [r for r in runs if r.end is None and alive(r.pid) and self.owner(r.pid) is not None]

    def pick_victim(self, tasks: dict[tuple, Task], start: int, timeout: float = 10.0):
        """A first attempt of a lingering task, with at least 0.6 s of its linger left."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            now = time.time()
            found = [
                r for r in self.running(tasks, start) if r.attempt == 1 and r.t + tasks[(r.key, r.n)].linger - now > 0.6
            ]
            if found:
                return self.rng.choice(sorted(found, key=lambda r: r.start))
            time.sleep(0.05)
        return None

    # -- what the faults use ----------------------------------------------------

    def unreaped(self, key: str) -> str:
        """The stalled first attempt of ``key`` if the gate still has it running, and when the reaper will look."""
        from django_keyed_queue.gate.keys import DEADLINE_INDEX
        from django_keyed_queue.process.state import get_gate

        gate = get_gate()
        holders = gate.inspect(key).holders.items()
        expired = {t: h for t, h in holders if h.state == "running" and (h.attempts, h.lost) == (1, 0)}
        if not expired:
            return ""
        seconds, micros = gate.client.time()
        score = gate.client.zscore(DEADLINE_INDEX, key)
        due = "not indexed" if score is None else f"indexed for {score / 1000 - seconds - micros / 1e6:+.2f} s"
        return f"the gate still had the stalled run as holder {expired} ({due})"

    def pause_consumers(self) -> list[int]:
        """SIGSTOP the workers' main processes (their consumers), for 8 s at most; child processes go on."""
        pids = [worker.process.pid for worker in self.live]
        self.stop(pids)
        self.watchdog = threading.Timer(8.0, self.resume, args=(pids,))
        self.watchdog.daemon = True
        self.watchdog.start()
        return pids

    def resume_consumers(self) -> None:
        self.watchdog.cancel()
        self.resume([worker.process.pid for worker in self.live])

    # -- rounds ---------------------------------------------------------------

    def plan(self, index: int) -> list[tuple[str, int, float]]:
        keys = [f"r{index:03d}-k{i:02d}" for i in range(self.args.keys)]
        counts: Counter = Counter()
        plan = []
        for i in range(self.args.tasks_per_round):
            key = keys[i] if i < len(keys) else self.rng.choice(keys)
            n = counts[key]
            counts[key] += 1
            lingers = self.rng.random() < (P_LINGER_FIRST if n == 0 else P_LINGER) or (n == 0 and i < 2)
            plan.append((key, n, round(self.rng.uniform(*LINGER), 2) if lingers else 0.0))
        return plan

    def run_round(self, index: int, kind: str) -> RoundResult:
        from django_keyed_queue.process.state import get_gate
        from testproject.demo.tasks import lingering_step

        began = time.monotonic()
        start = len(self.refresh())
        tasks: dict[tuple, Task] = {}
        if kind == "lost-message":
            self.pause_consumers()  # keeps the first granted messages in the queue for the fault to delete
        try:
            for key, n, linger in self.plan(index):
                result = lingering_step.apply_async((key, n, linger))
                tasks[(key, n)] = Task(result.id, key, n, linger)
        except BaseException:
            self.resume_consumers()
            raise
        if kind != "lost-message":
            time.sleep(self.rng.uniform(0.1, 2.5))
        fault = INJECT[kind](self, tasks, start)
        records, timed_out = self.wait_for_records(list(tasks.values()))
        self.wait_for_runs_to_end(tasks, start)
        events = self.refresh()
        gate = {key: get_gate().inspect(key) for key in {k for k, _ in tasks}}
        verdict = check_round(events, start, list(tasks.values()), records, gate, alive)
        if timed_out:
            verdict.violations.insert(
                0, f"[G6 timeout] {len(timed_out)} records not terminal after {self.args.timeout:.0f} s"
            )
        self.measure_recoveries(fault, events, start, verdict)
        for worker in list(self.live):
            if worker.process.poll() is not None:
                verdict.violations.append(
                    f"[harness] worker {worker.name} died on its own (exit {worker.process.returncode})"
                )
                self.live.remove(worker)
                self.start_worker()
        verdict.violations = [f"round {index} ({kind}): {v}" for v in verdict.violations]
        return RoundResult(index, fault, len(tasks), time.monotonic() - began, verdict)

    def measure_recoveries(self, fault: Fault, events: list[dict], start: int, verdict: Verdict) -> None:
        """Fault to the next start on each victim's key (lost message: to the start of that task)."""
        if fault.kind == "redis-restart":
            self.measure_resumes(fault, events, verdict)
            return
        runs, _ = pair_runs(events, {v.key for v in fault.victims}, start)
        for victim in fault.victims:
            hit = [r for r in runs if (r.key, r.n, r.pid, r.attempt) == (victim.key, victim.n, victim.pid, 1)]
            if fault.kind == "stall" and hit and hit[0].holds is True:
                fault.unfenced += 1
                fault.notes.append("resumed before the reaper took its key: not a recovery")
                continue
            if fault.kind.startswith("kill") and hit and hit[0].end is not None and hit[0].end < fault.index:
                fault.notes.append(f"{victim.key}#{victim.n} had ended before the kill")
                continue
            after = next_start(events, fault.index, victim.key, victim.n if fault.kind == "lost-message" else None)
            if after is None:
                verdict.violations.append(f"[G3 no recovery] {fault.kind}: no start on {victim.key} after the fault")
                continue
            fault.recoveries.append(after["t"] - fault.t)
            if fault.recoveries[-1] > BOUNDS[fault.kind]:
                owner = self.owner(after["pid"])
                where = f"pid {after['pid']}" + (f" on {owner.name}" if owner else "")
                fault.notes.append(f"{victim.key} late: {fault.recoveries[-1]:.2f} s, restarted in {where}")

    def measure_resumes(self, fault: Fault, events: list[dict], verdict: Verdict) -> None:
        """Redis back to the first start, after the kill, of each key that had tasks waiting."""
        starts = [e for e in events[fault.index :] if e["event"] == "start" and e["t"] > fault.t]
        for victim in fault.victims:
            after = next((e for e in starts if e["key"] == victim.key), None)
            if after is None:
                verdict.violations.append(f"[G3 no recovery] redis-restart: no start on {victim.key} after the restart")
                continue
            # A start logged between the kill and the restart would be at most a few ms early: count it as 0.
            fault.recoveries.append(max(0.0, after["t"] - fault.back))
            if fault.recoveries[-1] > BOUNDS[fault.kind]:
                fault.notes.append(f"{victim.key} late: {fault.recoveries[-1]:.2f} s")

    def wait_for_records(self, tasks: list[Task]) -> tuple[dict[str, Record], list[str]]:
        from django_keyed_queue.records.models import KeyedTask
        from django_keyed_queue.records.statuses import TERMINAL_STATUSES

        ids = [t.task_id for t in tasks]
        deadline = time.monotonic() + self.args.timeout
        while True:
            rows = KeyedTask.objects.filter(task_id__in=ids).values_list(
                "task_id", "status", "ticket", "attempts", "error"
            )
            records = {row[0]: Record(*row[1:]) for row in rows}
            pending = [
                t for t in tasks if t.task_id not in records or records[t.task_id].status not in TERMINAL_STATUSES
            ]
            if not pending:
                return records, []
            if time.monotonic() > deadline:
                return records, [
                    f"{t.key}#{t.n} [{t.task_id}] {records[t.task_id].status if t.task_id in records else 'no record'}"
                    for t in pending
                ]
            time.sleep(0.1)

    def wait_for_runs_to_end(self, tasks: dict[tuple, Task], start: int, timeout: float = 15.0) -> None:
        """A stalled run ends after its SIGCONT: wait for it so the checks see its end."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            runs, _ = pair_runs(self.refresh(), {k for k, _ in tasks}, start)
            if all(r.end is not None or not alive(r.pid) for r in runs):
                return
            time.sleep(0.1)


def revision() -> str:
    """The commit under test, and whether the package or the testproject differ from it."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "django_keyed_queue", "testproject"],
            cwd=root,
            capture_output=True,
            text=True,
        )
    except OSError:
        return "commit unknown"
    return f"commit {head.stdout.strip() or '?'}" + (" with local changes" if dirty.stdout.strip() else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--keys", type=int, default=12, help="fresh keys per round")
    parser.add_argument("--tasks-per-round", type=int, default=36)
    parser.add_argument("--seed", type=int, help="fixes the plan, the fault schedule and the victims (not timing)")
    parser.add_argument(
        "--faults",
        default=",".join(DEFAULT_FAULTS),
        help=f"comma-separated subset of {','.join(FAULTS)} (default: all but redis-restart)",
    )
    parser.add_argument("--timeout", type=float, default=30, help="seconds a round's records may take to be terminal")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (worker logs, database)")
    args = parser.parse_args(argv)
    kinds = [k.strip() for k in args.faults.split(",") if k.strip()]
    if not kinds or set(kinds) - set(FAULTS) or args.keys < 2 or args.tasks_per_round < args.keys:
        parser.error(f"--faults from {FAULTS}; --keys >= 2; --tasks-per-round >= --keys")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1_000_000)
    rng = random.Random(seed)
    schedule = (kinds * (args.rounds // len(kinds) + 1))[: args.rounds]
    rng.shuffle(schedule)

    began = time.monotonic()
    cluster = Cluster(0, CONCURRENCY, keep=args.keep)
    restarts = "redis-restart" in kinds
    if restarts:  # the gate moves into the broker's redis-server (db 0), as in a project with one Redis
        os.environ["TESTPROJECT_GATE_REDIS_URL"] = f"{cluster.broker_url}/0"
    # This process submits: its gate must use the workers' timings, so set them before django.setup().
    os.environ.update({f"KEYED_QUEUE_{name}": str(value) for name, value in TIMINGS.items()})
    results: list[RoundResult] = []
    soak = None
    failed = True
    try:
        cluster.start()
        if restarts:  # Cluster starts it without persistence; nothing is in it yet and no worker runs
            cluster.servers[0].stop()
            cluster.servers[0].start(*AOF_ALWAYS)
        soak = Soak(cluster, args, rng.randrange(1_000_000))
        for _ in range(WORKERS):
            soak.start_worker()
        print(
            f"{WORKERS} workers x prefork {CONCURRENCY}, {os.cpu_count()} CPUs, lease {TIMINGS['LEASE_SECONDS']} s, "
            f"dispatch timeout {TIMINGS['DISPATCH_TIMEOUT_SECONDS']} s, reaper every "
            f"{TIMINGS['REAP_INTERVAL_SECONDS']} s; seed {seed}; {revision()}; setup {time.monotonic() - began:.1f} s"
            + ("; one persistent redis-server for broker, gate and history" if restarts else ""),
            flush=True,
        )
        for index, kind in enumerate(schedule, 1):
            result = soak.run_round(index, kind)
            results.append(result)
            print(round_line(result, args.rounds), flush=True)
            for line in result.verdict.violations[:5]:
                print(f"    {line}", flush=True)
        failed = any(r.verdict.violations for r in results)
    finally:
        if soak is not None:
            soak.resume()
            if failed:  # the history lives in a redis-server about to stop: keep it with the logs
                try:
                    events = soak.refresh()
                except Exception:
                    events = soak.events
                with open(cluster.dir / "history.jsonl", "w") as out:
                    out.writelines(json.dumps(e) + "\n" for e in events)
        log_lines = log_problems(cluster.workers)
        cluster.stop(failed=failed)
    violations = print_summary(results, log_lines, time.monotonic() - began, seed, kinds)
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
