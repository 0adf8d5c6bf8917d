"""What ``python -m bench.userproject`` prints after its rounds, one workload at a time."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import report
from .fairness import print_fairness, summarize_fairness
from .report import PEERS, print_cpu, print_ratios, print_targets, summarize
from .stats import median, percentile

#: Each variant whose tasks leave a row apiece in the project's database, and what the rows are called.
ROWS = {
    "keyed records": ("keyed", "bulk", "pooled"),
    "stored results": ("results",),
    **{f"{peer} jobs": (peer,) for peer in PEERS},
}


def report_workload(rounds: list, targets: dict[str, float], cpu_extra_target: float | None) -> dict:
    """Print one workload's rounds and figures; its summary (fairness's under ``"fairness"``)."""
    print_rounds(rounds)
    measured = [r for r in rounds if not r.problems]
    summary = summarize(measured, targets)
    if summary:
        print_ratios(summary)
        print_targets(summary, cpu_extra_target)
    print()
    print_cpu(rounds)
    print_settle(rounds)
    print_lost_updates(rounds)
    child_process = summarize_child_process(rounds)
    if child_process:
        print_child_process(child_process)
        summary["child process"] = child_process
    fairness = summarize_fairness([r for r in measured if r.scenario == "fairness"])
    if fairness:
        print_fairness(fairness)
        summary["fairness"] = fairness
    return summary


def print_rounds(rounds: list) -> None:
    """The rounds, with each process group's CPU per task (ms) as the columns."""
    groups = next((list(r.cpu) for r in rounds if r.cpu), [])
    report.print_rounds(rounds, [(f"{name} CPU ms/t", cpu_of(name)) for name in groups])


def cpu_of(group: str) -> Callable[[Any], float]:
    """A round's CPU per task of one process group, ms."""
    return lambda r: 1000 * r.cpu.get(group, 0.0) / r.tasks


def print_settle(rounds: list) -> None:
    for kind, variants in ROWS.items():
        settle = [
            r.settle_seconds - r.wall_seconds for r in rounds if r.variant in variants and r.settle_seconds is not None
        ]
        if settle:
            print(f"{kind} all terminal in the database {median(settle):.2f} s (median) after the last task ended")


def print_lost_updates(rounds: list) -> None:
    """The realistic rounds' account updates lost, per round: two tasks of one account ran at once, and the
    later save wrote back a count read before the earlier one's."""
    measured = [r for r in rounds if r.lost_updates is not None]
    if not measured:
        return
    print("account updates lost (two tasks of one account at once), per round:")
    for scenario in dict.fromkeys(r.scenario for r in measured):
        of_scenario = [r for r in measured if r.scenario == scenario]
        cells = [
            f"{variant} {', '.join(str(r.lost_updates) for r in of_scenario if r.variant == variant)}"
            for variant in dict.fromkeys(r.variant for r in of_scenario)
        ]
        print(f"  {scenario:<10} {'; '.join(cells)}")


def summarize_child_process(rounds: list) -> dict[str, dict[str, float]]:
    """Where a many-keys task's time goes in a child process, per variant: its body (mean and p99), and the gap
    to the next task's start in that process (the worker's own work around a task), medians of rounds."""
    measured = [r for r in rounds if r.bodies_ms and r.gaps_ms and not r.problems]
    summary = {}
    for variant in dict.fromkeys(r.variant for r in measured):
        of_variant = [r for r in measured if r.variant == variant]
        summary[variant] = {
            "body ms": median(sum(r.bodies_ms) / len(r.bodies_ms) for r in of_variant),
            "body p99 ms": median(percentile(r.bodies_ms, 99) for r in of_variant),
            "gap ms": median(sum(r.gaps_ms) / len(r.gaps_ms) for r in of_variant),
        }
    return summary


def print_child_process(summary: dict[str, dict[str, float]]) -> None:
    print("a many-keys task in a child process, ms (medians of rounds): body mean / p99; gap to its next task mean")
    for variant, s in summary.items():
        print(f"  {variant:<8} body {s['body ms']:6.2f} / {s['body p99 ms']:6.1f}   gap {s['gap ms']:5.2f}")
