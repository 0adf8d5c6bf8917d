"""Printing the benchmark's figures: one row per round, then medians, ratios against the targets, costs."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from .harness import IN_SCRIPT, gate_round_trips
from .stats import median, percentile

#: The issue's targets: keyed throughput / plain throughput, per scenario.
TARGETS = {"many-keys": 0.8, "hot-key": 1.0}
#: Where a records database's target differs (PostgreSQL's own CPU per row is the largest piece left).
DATABASE_TARGETS = {"postgresql": {"many-keys": 0.75}}
#: The same for tasks as users write them (a row read and updated, 10 ms waiting): bench/userproject.py's.
REALISTIC_TARGETS = {"many-keys": 0.95}
#: Keyed throughput / plain Celery's storing each result with django-celery-results ("results").
RESULTS_TARGET = 1.0
#: Bulk submission (apply_async_many) / plain Celery's loop of apply_async, on many keys.
BULK_TARGET = 1.0
#: The most CPU a keyed many-keys task may cost beyond a plain one, every process counted (ms).
CPU_EXTRA_TARGET_MS = 0.5
#: The same where a records database's differs.
DATABASE_CPU_EXTRA_TARGET_MS = {"postgresql": 0.7}
#: The hot key's keyed handoff (end of task n to start of n+1), 99th percentile (ms).
HANDOFF_P99_TARGET_MS = 5.0
#: Other libraries' per-key serial tasks, run beside the keyed ones (bench/peer_procrastinate.py).
PEERS = ("procrastinate",)
#: What keyed throughput is compared with beside plain Celery: plain tasks that store their results, and the peers.
BASELINES = ("results", *PEERS)
#: ``pooled`` is the keyed task of a pool with room: keyed plus what a pool costs (bench/userproject.py's).
VARIANTS = ("plain", "keyed", "bulk", "pooled", "chain", *BASELINES)


def per_task(counter: Counter, tasks: int, names=None) -> float:
    return sum(v for k, v in counter.items() if names is None or k in names) / tasks


def print_rounds(rounds: list, columns: Sequence[tuple[str, Callable[[Any], float]]] | None = None) -> None:
    """One line per round: its scenario, variant, size and times, then ``columns`` (each a name, and a round's
    figure): by default its CPU and its gate and broker commands per task (``bench.throughput``'s)."""
    if columns is None:
        columns = [
            ("CPU ms/t", lambda r: 1000 * sum(r.cpu.values()) / r.tasks),
            ("gate RT/t", lambda r: gate_round_trips(r.gate) / r.tasks),
            ("gate cmd/t", lambda r: per_task(r.gate, r.tasks)),
            ("broker cmd/t", lambda r: per_task(r.broker, r.tasks)),
        ]
    widths = [max(8, len(name)) for name, _ in columns]
    variant_width = max([7, *(len(r.variant) for r in rounds)])
    named = " ".join(f"{name:>{width}}" for (name, _), width in zip(columns, widths, strict=True))
    header = (
        f"{'scenario':<10} {'rnd':>3} {'variant':<{variant_width}} {'tasks':>6} {'submit s':>9} {'wall s':>7} "
        f"{'tasks/s':>8} {'settle s':>8} {named}"
    )
    print(header)
    print("-" * len(header))
    for r in rounds:
        settle = f"{r.settle_seconds:8.2f}" if r.settle_seconds is not None else f"{'-':>8}"
        cells = " ".join(f"{figure(r):>{width}.2f}" for (_, figure), width in zip(columns, widths, strict=True))
        print(
            f"{r.scenario:<10} {r.index:>3} {r.variant:<{variant_width}} {r.tasks:>6} {r.submit_seconds:>9.2f} "
            f"{r.wall_seconds:>7.2f} {r.throughput:>8.0f} {settle} {cells}"
        )


def paired_ratios(over: list, under: list) -> list[float]:
    """Round by round (the variants alternate), ``over``'s throughput / ``under``'s."""
    return [o.throughput / u.throughput for u, o in zip(under, over, strict=False)]


def cpu_ms(rounds: list) -> float:
    """Median of ``rounds``' CPU per task, every process counted (ms)."""
    return median([1000 * sum(r.cpu.values()) / r.tasks for r in rounds])


def summarize(rounds: list, targets: dict[str, float] = TARGETS) -> dict:
    """Per scenario of ``targets``: median throughput per variant and the median of the per-round keyed/plain
    ratios (and keyed/baseline, for each baseline that ran; pooled/plain and pooled/keyed, if pooled ran)."""
    summary = {}
    for scenario in targets:
        of = {v: [r for r in rounds if r.scenario == scenario and r.variant == v] for v in VARIANTS}
        ratios = paired_ratios(of["keyed"], of["plain"])
        if not ratios:
            continue
        summary[scenario] = {
            **{v: median([r.throughput for r in group]) for v, group in of.items() if group},
            "ratios": ratios,
            "ratio": median(ratios),
            "target": targets[scenario],
            "met": median(ratios) >= targets[scenario],
        }
        if all(r.cpu for r in of["plain"] + of["keyed"]):
            summary[scenario]["cpu extra ms"] = cpu_ms(of["keyed"]) - cpu_ms(of["plain"])
        bulk_ratios = paired_ratios(of["bulk"], of["plain"])
        if bulk_ratios:
            pairs = zip(of["plain"], of["bulk"], strict=False)
            submit_ratios = [p.submit_seconds / b.submit_seconds for p, b in pairs if b.submit_seconds]
            summary[scenario].update(
                {
                    "bulk ratios": bulk_ratios,
                    "bulk ratio": median(bulk_ratios),
                    "bulk submit ratio": median(submit_ratios),
                    "bulk met": median(bulk_ratios) >= BULK_TARGET,
                }
            )
        compared = [("keyed", baseline) for baseline in BASELINES] + [("pooled", "plain"), ("pooled", "keyed")]
        for over, under in compared:
            over_under = paired_ratios(of[over], of[under])
            if over_under:
                summary[scenario].update(
                    {f"{over}/{under} ratios": over_under, f"{over}/{under} ratio": median(over_under)}
                )
        if of["pooled"] and all(r.cpu for r in of["pooled"] + of["keyed"]):
            summary[scenario]["pooled cpu extra ms"] = cpu_ms(of["pooled"]) - cpu_ms(of["keyed"])
        for v in ("keyed", "chain", *PEERS):
            handoffs = [h for r in of[v] for h in r.handoffs_ms]
            if handoffs:
                summary[scenario][f"{v} handoff ms"] = {
                    "n": len(handoffs),
                    **{f"p{q}": percentile(handoffs, q) for q in (50, 90, 99)},
                    "max": max(handoffs),
                }
    return summary


def print_summary(rounds: list, summary: dict, submit_us: dict[str, list[float]] | None = None) -> None:
    print_ratios(summary)
    _print_costs(rounds)
    if submit_us and submit_us.get("plain"):
        summary["submit cost us"] = print_submit_cost(submit_us)
    print_targets(summary)


def print_ratios(summary: dict) -> None:
    """Per scenario: throughputs, keyed/plain, keyed/peer, bulk/plain and pooled's ratios, handoff percentiles."""
    print()
    for scenario, s in summary.items():
        chain = f"  (plain Celery chain, serial: {s['chain']:.0f} tasks/s)" if "chain" in s else ""
        print(
            f"{scenario:<10} plain {s['plain']:5.0f} tasks/s  keyed {s['keyed']:5.0f} tasks/s  "
            f"{_median_of(s, 'keyed/plain', 'ratio')}{chain}"
        )
        for baseline in BASELINES:
            if f"keyed/{baseline} ratio" in s:
                print(f"{'':<10} {baseline} {s[baseline]:5.0f} tasks/s  {_median_of(s, f'keyed/{baseline}')}")
        if "bulk ratio" in s:
            print(
                f"{'':<10} bulk  {s['bulk']:5.0f} tasks/s  {_median_of(s, 'bulk/plain', 'bulk ratio')}; "
                f"submission alone {s['bulk submit ratio']:.2f}x plain's loop"
            )
        if "pooled/keyed ratio" in s:
            print(
                f"{'':<10} pooled {s['pooled']:4.0f} tasks/s  {_median_of(s, 'pooled/plain')}  "
                f"{_median_of(s, 'pooled/keyed')}"
            )
            if "pooled cpu extra ms" in s:
                extra = s["pooled cpu extra ms"]
                print(f"{'':<10} CPU per task, pooled over keyed (every process counted): {extra:+.2f} ms")
        for v in ("keyed", "chain", *PEERS):
            h = s.get(f"{v} handoff ms")
            if h:
                print(
                    f"{'':<10} {v} handoff (end of task n -> start of n+1, same key), n={h['n']}: "
                    f"p50 {h['p50']:.1f} ms  p90 {h['p90']:.1f} ms  p99 {h['p99']:.1f} ms  max {h['max']:.1f} ms"
                )


def _median_of(summary: dict, name: str, field: str | None = None) -> str:
    """``name``'s median ratio and its rounds', kept under ``field`` (``f"{name} ratio"`` by default) and its plural."""
    field = field or f"{name} ratio"
    rounds = ", ".join(f"{x:.2f}" for x in summary[f"{field}s"])
    return f"{name} median {summary[field]:.2f} (rounds: {rounds})"


def print_ending(log_problems: list[str], seconds: float, *, failed: bool) -> None:
    """The workers' log lines at WARNING or worse (the first ten), the run's time and whether it failed."""
    print(f"\nworker log lines at WARNING or worse: {len(log_problems)}")
    for line in log_problems[:10]:
        print(f"  {line[:200]}")
    print(f"total time {seconds:.0f} s; {'FAILED' if failed else 'all tasks accounted for'}")


def print_targets(summary: dict, cpu_extra_target: float | None = CPU_EXTRA_TARGET_MS) -> None:
    """Each scenario's ratios against their targets (the CPU extra's only where ``cpu_extra_target`` is one)."""
    print("\ntargets (median keyed/plain throughput ratio):")
    for scenario, s in summary.items():
        if "target" not in s:
            continue
        verdict = "MET" if s["met"] else "NOT MET"
        print(f"  {scenario:<10} {s['ratio']:.2f} >= {s['target']}: {verdict}")
        if "keyed handoff ms" in s:
            p99 = s["keyed handoff ms"]["p99"]
            verdict = "MET" if p99 <= HANDOFF_P99_TARGET_MS else "NOT MET"
            print(f"  {'':<10} handoff p99 {p99:.1f} ms <= {HANDOFF_P99_TARGET_MS}: {verdict}")
        if scenario == "many-keys" and "cpu extra ms" in s and cpu_extra_target is not None:
            verdict = "MET" if s["cpu extra ms"] <= cpu_extra_target else "NOT MET"
            extra = f"{s['cpu extra ms']:.2f} ms <= {cpu_extra_target}"
            print(f"  {'':<10} CPU per task, keyed over plain (every process counted): {extra}: {verdict}")
        if "bulk ratio" in s:
            verdict = "MET" if s["bulk met"] else "NOT MET"
            print(f"  {'bulk':<10} {s['bulk ratio']:.2f} >= {BULK_TARGET}: {verdict}")
        if "keyed/results ratio" in s:
            ratio = s["keyed/results ratio"]
            verdict = "MET" if ratio >= RESULTS_TARGET else "NOT MET"
            print(f"  {'':<10} keyed/(plain+results) {ratio:.2f} >= {RESULTS_TARGET}: {verdict}")


def _print_costs(rounds: list) -> None:
    keyed = [r for r in rounds if r.variant in ("keyed", "bulk")]
    if keyed:
        total: Counter = Counter()
        for r in keyed:
            total.update(r.gate)
        n = sum(r.tasks for r in keyed)
        scripts = ", ".join(f"{k} {v / n:.2f}" for k, v in total.most_common() if k not in IN_SCRIPT)
        inside = ", ".join(f"{k} {v / n:.2f}" for k, v in total.most_common() if k in IN_SCRIPT)
        print(f"\ngate redis-server, per keyed task: {gate_round_trips(total) / n:.2f} round trips ({scripts})")
        print(f"  + {per_task(total, n, IN_SCRIPT):.2f} commands run inside the scripts ({inside})")
    for variant in VARIANTS:
        group = [r for r in rounds if r.variant == variant]
        if group:
            total = Counter()
            for r in group:
                total.update(r.broker)
            n = sum(r.tasks for r in group)
            top = ", ".join(f"{k} {v / n:.2f}" for k, v in total.most_common(6))
            print(f"broker redis-server, per {variant} task: {per_task(total, n):.2f} commands ({top}, ...)")
    print_cpu(rounds)
    settle = [r.settle_seconds - r.wall_seconds for r in keyed if r.settle_seconds is not None]
    if settle:
        print(f"keyed records all terminal in the database {median(settle):.2f} s (median) after the last task ended")


def print_cpu(rounds: list) -> None:
    """CPU ms per task of each process group, median of rounds, per scenario (in the rounds' order) and variant."""
    groups = next((list(r.cpu) for r in rounds if r.cpu), [])
    if not groups:
        return
    print(f"CPU ms per task, median of rounds: {' + '.join(groups)} = total")
    width = max(6, *(len(r.variant) for r in rounds))
    for scenario in dict.fromkeys(r.scenario for r in rounds):
        for variant in VARIANTS:
            group = [r for r in rounds if r.scenario == scenario and r.variant == variant and r.cpu]
            if group:
                parts = {k: median([1000 * r.cpu[k] / r.tasks for r in group]) for k in group[0].cpu}
                cells = " + ".join(f"{v:.2f}" for v in parts.values())
                print(f"  {scenario:<10} {variant:<{width}} {cells} = {sum(parts.values()):.2f}")


def print_profile(rounds: list) -> None:
    seconds: dict[str, Counter] = defaultdict(Counter)
    calls: dict[str, Counter] = defaultdict(Counter)
    tasks: Counter = Counter()
    for r in rounds:
        if not r.profile:
            continue
        tasks[(r.scenario, r.variant)] += r.tasks
        for label, (n, s) in r.profile.items():
            seconds[(r.scenario, r.variant)][label] += s
            calls[(r.scenario, r.variant)][label] += n
    if not seconds:
        return
    print("\nsubmit path in this process (--profile): microseconds per submitted task [per call, calls per task]")
    for (scenario, variant), spent in seconds.items():
        n = tasks[(scenario, variant)]
        print(f"  {scenario} {variant}:")
        for label, s in spent.most_common():
            c = calls[(scenario, variant)][label]
            print(f"    {1e6 * s / n:7.0f}  {label} [{1e6 * s / c:.0f} us, {c / n:.2f}]")


def print_submit_cost(submit_us: dict[str, list[float]]) -> dict:
    """The producer's cost per submission with idle workers, best of the rounds (least disturbed by other load)."""
    plain, keyed = min(submit_us["plain"]), min(submit_us["keyed"])
    print(
        f"submit cost with idle workers (each task granted at once, never run), best of {len(submit_us['plain'])}: "
        f"plain {plain:.0f} us, keyed {keyed:.0f} us per task; plain/keyed {plain / keyed:.2f} "
        "(the many-keys ratio if one producer were the only bottleneck)"
    )
    return {"plain": plain, "keyed": keyed, "rounds": submit_us}
