"""The crash soak's timings, its verdicts over one round (pure functions of the ordered history, the records
and the gate) and its report.

The history is the testproject's Redis list of ``start``/``end`` events (RPUSH order is the order events
happened). A *run* is one start of a task paired with its end (same key, n, attempt and pid). A run is
*fenced* when the gate took its key away: its end says ``holds=False``, or it never ended because its
process died. Exclusion (G1) ignores fenced runs, so it is checked here over the runs; the first starts
that order (G2) compares come from testproject/history_checks.py, the checks the tests share.
"""

from __future__ import annotations

import os
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from testproject.history_checks import check_serial

from .stats import median

if TYPE_CHECKING:
    from django_keyed_queue.gate import KeySnapshot

TIMINGS = {"LEASE_SECONDS": 1.5, "DISPATCH_TIMEOUT_SECONDS": 3.0, "REAP_INTERVAL_SECONDS": 0.3}
FAULTS = ("kill-pool", "kill-worker", "stall", "lost-message", "redis-restart")
#: A restart needs one persistent redis-server for the broker, the gate and the history: opt-in, not a default.
DEFAULT_FAULTS = FAULTS[:4]
#: G3: a lost holder blocks its key for at most the lease plus the reaper period, a lost message for at most the
#: dispatch timeout (plus the reaper period); 0.5 s of slack for the publish and the start on a loaded machine.
_CRASH_BOUND = TIMINGS["LEASE_SECONDS"] + 1.2 * TIMINGS["REAP_INTERVAL_SECONDS"] + 0.5
_LOST_BOUND = TIMINGS["DISPATCH_TIMEOUT_SECONDS"] + 1.2 * TIMINGS["REAP_INTERVAL_SECONDS"] + 0.5
#: Redis restart, from Redis answering again: the formula of tests/userproject/test_broker_and_gate_redis_restart.py
#: (lease + reaper period + 4 s for the workers to reconnect).
_RESUME_BOUND = TIMINGS["LEASE_SECONDS"] + TIMINGS["REAP_INTERVAL_SECONDS"] + 4
BOUNDS = {
    "kill-pool": _CRASH_BOUND,
    "kill-worker": _CRASH_BOUND,
    "stall": _CRASH_BOUND,
    "lost-message": _LOST_BOUND,
    "redis-restart": _RESUME_BOUND,
}
BOUNDS_NOTE = (
    f"lease + 1.2 x reap + 0.5 s = {_CRASH_BOUND:.2f}; lost message: dispatch timeout + ... = {_LOST_BOUND:.2f}"
)
#: Worker log records the faults cause by design; any other record at WARNING or worse is reported.
EXPECTED_LOG = (
    "lease lost",
    "finished after losing its lease",
    "WorkerLostError",
    "exited with 'signal 9 (SIGKILL)'",
)
#: What a Redis restart causes: clients that cannot reach it, and Celery's warning on a lost broker connection.
RESTART_LOG = (
    "Redis unreachable",
    "Redis is unreachable",
    "Connection to broker lost",
    "Cannot connect to redis",
    "CPendingDeprecationWarning",
)
LOG_RECORD = re.compile(r"^\[\d{4}-\d\d-\d\d [\d:,]+: (\w+)/")

#: The reason a record gives when a task lost more leases than its max_recoveries.
NO_RECOVERIES = "no recoveries left"


@dataclass
class Run:
    key: str
    n: int
    attempt: int
    pid: int
    start: int  # index of the start event in the history
    t: float
    end: int | None = None
    end_t: float | None = None
    holds: bool | None = None

    @property
    def label(self) -> str:
        return f"{self.key}#{self.n} attempt {self.attempt} (pid {self.pid}, history {self.start})"


@dataclass(frozen=True)
class Task:
    task_id: str
    key: str
    n: int
    linger: float


@dataclass(frozen=True)
class Record:
    """The fields of a KeyedTask row the checks read."""

    status: str
    ticket: int | None
    attempts: int
    error: str


@dataclass
class Verdict:
    violations: list[str] = field(default_factory=list)
    succeeded: int = 0
    #: Tasks failed because they lost more leases than max_recoveries (allowed, counted apart).
    failed_no_recoveries: list[Task] = field(default_factory=list)


def pair_runs(events: list[dict], keys: Iterable[str], start: int = 0) -> tuple[list[Run], list[str]]:
    """Runs of ``keys`` from ``events[start:]``, in start order, and pairing problems."""
    keys = set(keys)
    runs: list[Run] = []
    problems: list[str] = []
    running: dict[tuple, Run] = {}
    for i in range(start, len(events)):
        e = events[i]
        if e["key"] not in keys:
            continue
        ident = (e["key"], e["n"], e.get("attempt"), e["pid"])
        if e["event"] == "start":
            run = Run(e["key"], e["n"], e.get("attempt", 0), e["pid"], i, e["t"])
            if ident in running:
                problems.append(f"{run.label} started again in the same process before it ended")
            running[ident] = run
            runs.append(run)
        else:
            run = running.pop(ident, None)
            if run is None:
                problems.append(f"end event without a start at history {i}: {e}")
            else:
                run.end, run.end_t, run.holds = i, e["t"], e.get("holds")
    return runs, problems


def next_start(events: list[dict], after: int, key: str, n: int | None = None) -> dict | None:
    """The first start on ``key`` (of task ``n`` if given) at history index ``after`` or later."""
    for e in events[after:]:
        if e["event"] == "start" and e["key"] == key and (n is None or e["n"] == n):
            return e
    return None


def check_round(
    events: list[dict],
    start: int,
    tasks: list[Task],
    records: dict[str, Record],
    gate: dict[str, KeySnapshot],
    alive: Callable[[int], bool],
) -> Verdict:
    """Exclusion, order, one successful end per task, terminal records, an empty gate."""
    verdict = Verdict()

    def bad(tag: str, message: str) -> None:
        verdict.violations.append(f"[{tag}] {message}")

    keys = sorted({t.key for t in tasks})
    runs, problems = pair_runs(events, keys, start)
    for problem in problems:
        bad("history", problem)

    # Exclusion: a run that still held its key at its end held it all along (tokens never come back).
    holding: dict[str, list[Run]] = defaultdict(list)
    marks = sorted([(r.start, 1, r) for r in runs] + [(r.end, 0, r) for r in runs if r.end is not None])
    for _, is_start, run in marks:
        if run.holds is not True:
            continue
        if is_start:
            for other in holding[run.key]:
                bad("G1 exclusion", f"{run.label} started while {other.label} held {run.key} (both ended holding it)")
            holding[run.key].append(run)
        else:
            holding[run.key].remove(run)

    for run in runs:
        if run.end is None and alive(run.pid):
            bad("stuck run", f"never ended though its process lives: {run.label}")

    # G4: the gate hands out each attempt number of a ticket once.
    seen: dict[tuple, Run] = {}
    for run in runs:
        ident = (run.key, run.n, run.attempt)
        if ident in seen:
            bad("G4 double start", f"{run.label} and {seen[ident].label}")
        seen[ident] = run

    by_task = {(t.key, t.n): t for t in tasks}
    runs_of: dict[tuple, list[Run]] = defaultdict(list)
    for run in runs:
        runs_of[(run.key, run.n)].append(run)
        if (run.key, run.n) not in by_task:
            bad("G4 unknown run", f"a run of a task this round did not submit: {run.label}")

    # Order: first starts per key in ticket order. (Exclusion is G1's above, not the shared check's: a fenced
    # run may overlap the next by design.)
    first_starts = check_serial(e for e in events[start:] if e["key"] in keys).first_starts
    for key in keys:
        mine = [t for t in tasks if t.key == key]
        tickets = {t.n: (records[t.task_id].ticket if t.task_id in records else None) for t in mine}
        if any(ticket is None for ticket in tickets.values()):
            bad("G2 order", f"{key} has records without a ticket: {tickets}")
            continue
        expected = sorted(tickets, key=tickets.get)
        firsts = first_starts.get(key, [])
        if firsts != [n for n in expected if n in firsts]:
            bad("G2 order", f"{key} first starts {firsts}, ticket order {[(n, tickets[n]) for n in expected]}")

    for task in tasks:
        record = records.get(task.task_id)
        ran = runs_of[(task.key, task.n)]
        held_to_end = [r for r in ran if r.holds is True]
        name = f"{task.key}#{task.n} [{task.task_id}]"
        if not ran:
            bad("G6 never ran", f"{name} (record {record})")
        if record is None:
            bad("G6 no record", name)
        elif record.status == "succeeded":
            verdict.succeeded += 1
            if not held_to_end:
                bad("G6 record", f"succeeded but no run ended holding the key: {name}, runs {[r.label for r in ran]}")
            elif len(held_to_end) > 1:
                bad("G4 succeeded twice", f"{name} ended holding its key twice: {[r.label for r in held_to_end]}")
            elif record.attempts != held_to_end[0].attempt:
                bad(
                    "G6 record", f"{name} says {record.attempts} attempts; it ended on attempt {held_to_end[0].attempt}"
                )
        elif record.status == "failed" and NO_RECOVERIES in record.error:
            verdict.failed_no_recoveries.append(task)
            if held_to_end:
                bad(
                    "G6 record",
                    f"failed for lost leases, yet a run ended holding the key: {name}: {held_to_end[0].label}",
                )
        else:
            history = "; ".join(
                f"attempt {r.attempt} in pid {r.pid} "
                + {True: "ended holding the key", False: "ended fenced", None: "never ended"}[r.holds]
                + ("" if alive(r.pid) else ", process now dead")
                for r in ran
            )
            bad(
                "G6 record "
                + ("not terminal" if record.status not in ("succeeded", "failed", "cancelled") else "wrong"),
                f"{name} is {record.status!r} (attempts {record.attempts}, error {record.error!r}); "
                f"history: {history or 'never started'}",
            )

    for key, state in sorted(gate.items()):
        if state.holders or state.waiting or state.messages:
            bad(
                "G3 gate busy",
                f"{key} after the round: holders {state.holders}, waiting {state.waiting}, messages {state.messages}",
            )
    return verdict


# -- the report -------------------------------------------------------------------------------------------


def log_problems(workers: list) -> list[str]:
    """Worker log records at WARNING or worse (a record with its traceback lines is one entry)."""
    problems = []
    for worker in workers:
        if not worker.log_path.exists():
            continue
        record: list[str] = []
        for line in [*worker.log().splitlines(), "[0000-00-00 00:00:00,000: END/"]:
            match = LOG_RECORD.match(line)
            if match is None:
                record.append(line)
                continue
            head = LOG_RECORD.match(record[0]) if record else None
            if head is not None and head[1] in ("WARNING", "ERROR", "CRITICAL"):
                problems.append(f"{worker.name}: " + " | ".join(record))
            record = [line]
    return problems


def round_line(r, rounds: int) -> str:
    f, v = r.fault, r.verdict
    victims = "; ".join(v.description for v in f.victims[:2]) + (
        f" (+{len(f.victims) - 2})" if len(f.victims) > 2 else ""
    )
    recovery = "recovery " + "/".join(f"{x:.2f}" for x in f.recoveries) + " s" if f.recoveries else "no recovery"
    if f.kind == "redis-restart" and f.recoveries:  # one sample per waiting key: too many to list
        recovery = f"resume med {median(f.recoveries):.2f} max {max(f.recoveries):.2f} s"
    failed = f", {len(v.failed_no_recoveries)} failed (no recoveries left)" if v.failed_no_recoveries else ""
    status = "ok" if not v.violations else f"{len(v.violations)} VIOLATIONS"
    note = f" [{'; '.join(f.notes)}]" if f.notes else ""
    return (
        f"round {r.index:>3}/{rounds} {f.kind:<12} {recovery:<22} {r.tasks} tasks, {v.succeeded} succeeded{failed}, "
        f"{r.seconds:4.1f} s, {status} | {victims or '-'}{note}"
    )


def print_summary(
    results: list, log_lines: list[str], seconds: float, seed: int, chosen: Collection[str] = FAULTS
) -> list[str]:
    violations = [v for r in results for v in r.verdict.violations]
    kinds = Counter(r.fault.kind for r in results if r.fault.victims)
    missed = Counter(r.fault.kind for r in results if not r.fault.victims)
    recoveries: dict[str, list[float]] = defaultdict(list)
    for r in results:
        recoveries[r.fault.kind] += r.fault.recoveries
    print("\n== soak summary ==")
    print(f"rounds {len(results)}, seed {seed}, {seconds:.0f} s, load average {os.getloadavg()[0]:.2f}")
    print(
        "faults injected: "
        + ", ".join(f"{k} {kinds[k]}" for k in FAULTS if k in chosen)
        + (f"; missed: {dict(missed)}" if missed else "")
    )
    tasks = sum(r.tasks for r in results)
    succeeded = sum(r.verdict.succeeded for r in results)
    no_recoveries = sum(len(r.verdict.failed_no_recoveries) for r in results)
    print(f"tasks {tasks}: succeeded {succeeded}, failed with no recoveries left {no_recoveries}")
    print(f"recovery time (s)   faults  samples  median  worst  over bound (bound: {BOUNDS_NOTE})")
    for kind in (k for k in FAULTS if k in chosen):
        xs = recoveries[kind]
        if xs:
            late = sum(1 for x in xs if x > BOUNDS[kind])
            print(f"  {kind:<17} {kinds[kind]:>6} {len(xs):>8} {median(xs):>7.2f} {max(xs):>6.2f} {late:>6}")
        else:
            print(f"  {kind:<17} {kinds[kind]:>6} {0:>8} {'-':>7} {'-':>6} {'-':>6}")
    if "redis-restart" in chosen:
        print(
            "  redis-restart: resume, from Redis answering again to the next start of each key with tasks waiting; "
            f"bound lease + reap + 4 s = {_RESUME_BOUND:.2f}"
        )
    unfenced = sum(r.fault.unfenced for r in results)
    if unfenced:
        print(f"stalled runs the reaper had not fenced by their SIGCONT (no recovery sample): {unfenced}")
    expected = EXPECTED_LOG + (RESTART_LOG if "redis-restart" in chosen else ())
    unexpected = [line for line in log_lines if not any(p in line for p in expected)]
    print(f"worker log records at WARNING or worse: {len(log_lines)}, not caused by the faults: {len(unexpected)}")
    for line in unexpected[:8]:
        print(f"  {line[:300]}")
    tags = Counter(v.split("[", 1)[1].split("]", 1)[0] for v in violations)
    print(
        f"violations: {len(violations)}"
        + (f" ({', '.join(f'{t} {c}' for t, c in tags.most_common())})" if tags else "")
    )
    for line in violations[:10]:
        print(f"  {line}")
    return violations
