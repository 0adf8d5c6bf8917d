"""What ``python -m bench.userproject`` prints after its rounds, one workload at a time."""

from __future__ import annotations

from .fairness import print_fairness, summarize_fairness
from .report import PEERS, print_cpu, print_ratios, print_targets, summarize
from .stats import median

#: Each variant whose tasks leave a row apiece in the project's database, and what the rows are called.
ROWS = {
    "keyed records": ("keyed", "bulk"),
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
    fairness = summarize_fairness([r for r in measured if r.scenario == "fairness"])
    if fairness:
        print_fairness(fairness)
        summary["fairness"] = fairness
    return summary


def print_rounds(rounds: list) -> None:
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
