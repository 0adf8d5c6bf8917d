"""The benchmark's PNGs: throughputs per scenario and variant, and the hot key's handoff latency CDF; several
runs' throughputs side by side; and the fairness rounds' waits of the one-task keys.

    python -m bench.plot docs/benchmarks-userproject.png "SQLite (startproject)=A.json" "SQLite WAL=B.json" \
        "PostgreSQL=C.json"                   # bench.userproject's --json files, side by side
    python -m bench.plot --fairness docs/benchmarks-fairness.png "SQLite=A.json" ...   # their fairness waits
    python -m bench.plot --child-process docs/benchmarks-child-process.png "SQLite=A.json" ...  # a realistic task
    python -m bench.plot --cpu docs/benchmarks-cpu.png "SQLite=A.json" ...  # a many-keys task's CPU, process by process

``python -m bench.throughput --plot OUT.png`` draws the first kind from its own run.
"""

from __future__ import annotations

from pathlib import Path

from .fairness import ms_text
from .stats import percentile


def plot(rounds, summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (bars, cdf) = plt.subplots(1, 2, figsize=(11, 4.2))

    scenarios = [s for s in summary if "target" in summary[s]]
    width = 0.2
    styles = (
        ("plain", "#8c8c8c", "plain Celery"),
        ("keyed", "#2c7fb8", "keyed"),
        ("bulk", "#31a354", "keyed, apply_async_many"),
        ("chain", "#e6550d", "Celery chain"),
    )
    for j, (variant, color, label) in enumerate(styles):
        for i, scenario in enumerate(scenarios):
            if variant not in summary[scenario]:
                continue
            x = i + (j - 1.5) * width
            values = [r.throughput for r in rounds if r.scenario == scenario and r.variant == variant]
            middle = summary[scenario][variant]
            bars.bar(x, middle, width, color=color, label=label if i == len(scenarios) - 1 else None)
            bars.plot([x] * len(values), values, "k.", markersize=4)
            bars.annotate(f"{middle:.0f}", (x, middle), ha="center", va="bottom", fontsize=8)
    bars.set_xticks(range(len(scenarios)))
    bars.set_xticklabels(
        [f"{s}\nkeyed/plain {summary[s]['ratio']:.2f} (target {summary[s]['target']})" for s in scenarios]
    )
    bars.set_ylabel("tasks/s (bar: median, dots: rounds)")
    bars.set_title("Throughput, same workers, same run")
    bars.legend(fontsize=8)

    for variant, color in (("keyed", "#2c7fb8"), ("chain", "#e6550d")):
        handoffs = sorted(h for r in rounds if r.variant == variant for h in r.handoffs_ms)
        if not handoffs:
            continue
        n = len(handoffs)
        p50, p99 = percentile(handoffs, 50), percentile(handoffs, 99)
        label = f"{'keyed' if variant == 'keyed' else 'plain Celery chain'}: p50 {p50:.1f} ms, p99 {p99:.1f} ms"
        cdf.plot(handoffs, [(i + 1) / n for i in range(n)], color=color, label=label)
    log_ms_axis(cdf)
    cdf.set_xlabel("ms from the end of task n to the start of task n+1 (log scale)")
    cdf.set_ylabel("fraction of handoffs")
    cdf.set_title("Hot key: handoff latency (CDF)")
    cdf.grid(True, which="both", alpha=0.3)
    cdf.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def log_ms_axis(ax) -> None:
    """A log-scale x axis of milliseconds, its ticks at 1-2-5 steps, written plainly (10, not 10^1)."""
    ax.set_xscale("log")
    lo, hi = ax.get_xlim()
    steps = [m * 10**e for e in range(-1, 6) for m in (1, 2, 5)]
    ticks = [t for t in steps if lo <= t <= hi]
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.set_xlim(lo, hi)
    ax.minorticks_off()


def plot_databases(summaries: dict[str, dict], path: Path) -> None:
    """One bar chart of several runs of the benchmark (``--json`` files), one group per records database:
    plain, keyed and bulk throughput on many keys, plain and keyed on the hot key."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    panels = (("many-keys", ("plain", "keyed", "bulk")), ("hot-key", ("plain", "keyed")))
    colors = {"plain": "#8c8c8c", "keyed": "#2c7fb8", "bulk": "#31a354"}
    labels = {"plain": "plain Celery", "keyed": "keyed", "bulk": "keyed, apply_async_many"}
    for ax, (scenario, variants) in zip(axes, panels, strict=True):
        width = 0.8 / len(variants)
        for j, variant in enumerate(variants):
            for i, summary in enumerate(summaries.values()):
                s = summary.get(scenario, {})
                if variant not in s:
                    continue
                x = i + (j - (len(variants) - 1) / 2) * width
                ax.bar(x, s[variant], width, color=colors[variant], label=labels[variant] if i == 0 else None)
                if variant != "plain":
                    ratio = s["ratio"] if variant == "keyed" else s["bulk ratio"]
                    ax.annotate(f"{ratio:.2f}", (x, s[variant]), ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(summaries)))
        ax.set_xticklabels(list(summaries))
        ax.set_ylabel("tasks/s, median of rounds (label: / plain)")
        ax.set_title(f"{scenario}: same workers, same run")
        ax.set_ylim(0, ax.get_ylim()[1] * 1.25)
        ax.legend(fontsize=8, loc="upper center", ncol=len(variants))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


#: Each run's line in the fairness plot, in the order of the runs given.
RUN_STYLES = ("-", "--", ":", "-.")


def plot_fairness(summaries: dict[str, dict], path: Path) -> None:
    """The one-task keys' waits of the fairness rounds of several runs of bench.userproject (its ``--json``
    summaries), as CDFs on a log scale: one panel per workload, plain and keyed, one line style per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = {"noop": lambda s: s.get("fairness"), "realistic": lambda s: s.get("realistic", {}).get("fairness")}
    shown = [(name, of) for name, of in workloads.items() if any(of(s) for s in summaries.values())]
    fig, axes = plt.subplots(1, len(shown), figsize=(5.6 * len(shown), 4.4), squeeze=False)
    colors = {"plain": "#8c8c8c", "keyed": "#2c7fb8"}
    for ax, (workload, of) in zip(axes[0], shown, strict=True):
        sizes = set()
        for style, (run, summary) in zip(RUN_STYLES, summaries.items(), strict=False):
            for variant, s in (of(summary) or {}).items():
                waits = sorted(s["waits ms"])
                fraction = [(i + 1) / len(waits) for i in range(len(waits))]
                label = f"{run}, {variant}: p50 {ms_text(s['p50 ms'])} ms, p99 {ms_text(s['p99 ms'])} ms"
                ax.plot(waits, fraction, style, color=colors[variant], label=label)
                sizes.add(f"{s['keys']} one-task keys behind {s['hot tasks']} tasks of one key")
        log_ms_axis(ax)
        ax.set_xlabel("ms from submission to start (log scale; medians of rounds in the legend)")
        ax.set_ylabel("fraction of the one-task keys' tasks")
        ax.set_title(f"{workload} tasks: {'; '.join(sorted(sizes))}", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_child_process(summaries: dict[str, dict], path: Path) -> None:
    """Where a realistic many-keys task's time goes in a child process, in several runs of bench.userproject
    (its ``--json`` summaries): per run, plain and keyed, the task's body and the gap to the next task in
    that process (the worker's own work around a task), stacked, medians of rounds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {name: s["realistic"]["child process"] for name, s in summaries.items() if "realistic" in s}
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(runs) + 2), 4.4))
    colors = {"plain": "#8c8c8c", "keyed": "#2c7fb8"}
    width = 0.38
    for i, process in enumerate(runs.values()):
        for j, variant in enumerate(("plain", "keyed")):
            if variant not in process:
                continue
            body, gap = process[variant]["body ms"], process[variant]["gap ms"]
            x = i + (j - 0.5) * width
            ax.bar(x, body, width, color=colors[variant], label=f"{variant}: body" if i == 0 else None)
            ax.bar(x, gap, width, bottom=body, color=colors[variant], alpha=0.45, hatch="//",
                   label=f"{variant}: gap to its next task" if i == 0 else None)  # fmt: skip
            ax.text(x, body + gap, f"{body:.1f}\n+{gap:.1f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(runs)), list(runs), fontsize=8)
    ax.set_ylabel("ms per task in a child process (means, medians of rounds)")
    ax.set_title("A task that reads and updates a row, then waits 10 ms: its body, and the worker's work around it",
                 fontsize=9)  # fmt: skip
    ax.margins(y=0.15)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


#: The process groups of bench.userproject's CPU figures, bottom to top, and their colours.
CPU_GROUPS = (
    ("producer", "#fdae6b"),
    ("worker main", "#9ecae1"),
    ("child processes", "#3182bd"),
    ("redis", "#d62728"),
    ("postgres", "#756bb1"),
)


def plot_cpu(runs: dict[str, dict], path: Path) -> None:
    """CPU per many-keys task, plain and keyed, stacked by process (the producer, the worker's main process,
    its child processes, Redis, PostgreSQL), medians of rounds, for each workload of several runs of
    bench.userproject (its ``--json`` files)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .stats import median

    ran = {r["workload"] for run in runs.values() for r in run["rounds"]}
    workloads = [w for w in ("noop", "realistic") if w in ran]
    fig, axes = plt.subplots(1, len(workloads), figsize=(5.2 * len(workloads) + 1, 4.6), squeeze=False)
    width = 0.38
    for ax, workload in zip(axes[0], workloads, strict=True):
        tallest = 0.0
        for i, run in enumerate(runs.values()):
            for j, variant in enumerate(("plain", "keyed")):
                rounds = [
                    r for r in run["rounds"]
                    if (r["workload"], r["scenario"], r["variant"]) == (workload, "many-keys", variant) and r["cpu"]
                ]  # fmt: skip
                if not rounds:
                    continue
                x, bottom = i + (j - 0.5) * width, 0.0
                for group, color in CPU_GROUPS:
                    ms = median([1000 * r["cpu"].get(group, 0.0) / r["tasks"] for r in rounds])
                    label = group if i == 0 and j == 0 else None
                    ax.bar(x, ms, width, bottom=bottom, color=color, alpha=1.0 if variant == "keyed" else 0.55,
                           edgecolor="white", linewidth=0.5, label=label)  # fmt: skip
                    bottom += ms
                ax.text(x, bottom, f"{variant}\n{bottom:.2f}", ha="center", va="bottom", fontsize=7)
                tallest = max(tallest, bottom)
        ax.set_xticks(range(len(runs)), list(runs), fontsize=8)
        ax.set_title(f"{workload}: CPU per many-keys task, every process (pale: plain Celery)", fontsize=9)
        ax.set_ylabel("ms of CPU per task (medians of rounds)")
        ax.set_ylim(0, tallest * 1.15)
        ax.grid(True, axis="y", alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="lower center", ncol=len(CPU_GROUPS))
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    """``python -m bench.plot [--fairness|--child-process|--cpu] OUT.png NAME=RUN.json ...``: the runs' summaries
    side by side (with ``--fairness``, bench.userproject's fairness waits; with ``--child-process``, where a
    realistic task's time goes in a child process; with ``--cpu``, a many-keys task's CPU, process by process)."""
    import json
    import sys

    args = argv if argv is not None else sys.argv[1:]
    kinds = {"--fairness": plot_fairness, "--child-process": plot_child_process, "--cpu": plot_cpu}
    draw = kinds.get(args[0], plot_databases) if args else plot_databases
    given = args[1:] if args and args[0] in kinds else args
    if len(given) < 2 or given[0].startswith("-") or not all("=" in run for run in given[1:]):
        sys.exit(
            "usage: python -m bench.plot [--fairness|--child-process|--cpu] OUT.png NAME=RUN.json [NAME=RUN.json ...]"
        )
    out, *runs = given
    summaries = {}
    for run in runs:
        name, file = run.split("=", 1)
        loaded = json.loads(Path(file).read_text())
        summaries[name] = loaded if draw is plot_cpu else loaded["summary"]  # the CPU plot reads the rounds
    draw(summaries, Path(out))


if __name__ == "__main__":
    main()
