"""Fairness across keys: one hot key's backlog submitted first, then many keys with one task each, right after.

Plain Celery's broker hands tasks out first in, first out: the one-task keys wait behind the whole backlog.
Keyed, the hot key's tasks wait in the gate, one of them in the broker at a time, so the one-task keys start
as soon as a worker process is free. A one-task key's wait is its task's start (the history's line) less its
submission (the producer's time just before its ``apply_async``), on this machine's one clock.
"""

from __future__ import annotations

from .stats import median, percentile

#: The key of the backlog; the one-task keys are ``acct-0``, ``acct-1``...
HOT_KEY = "hot"


def fairness_plan(hot_tasks: int, keys: int) -> list[tuple[str, int]]:
    """``hot_tasks`` tasks of the hot key, then one task of each of ``keys`` keys."""
    return [(HOT_KEY, n) for n in range(hot_tasks)] + [(f"acct-{i}", 0) for i in range(keys)]


def waits_ms(events: list[dict], plan: list[tuple[str, int]], submitted: list[float]) -> list[float]:
    """Each one-task key's wait, in ms (``submitted``: the time of each submission, in plan order)."""
    started = {(e["key"], e["n"]): e["t"] for e in events if e["event"] == "start"}
    return [
        1000 * (started[task] - sent)
        for task, sent in zip(plan, submitted, strict=True)
        if task[0] != HOT_KEY and task in started
    ]


def summarize_fairness(rounds: list) -> dict:
    """Per variant: the one-task keys' wait p50 and p99 of each round and their medians, and every wait."""
    summary = {}
    for variant in dict.fromkeys(r.variant for r in rounds if r.waits_ms):
        measured = [r for r in rounds if r.variant == variant and r.waits_ms]
        p50s = [percentile(r.waits_ms, 50) for r in measured]
        p99s = [percentile(r.waits_ms, 99) for r in measured]
        summary[variant] = {
            "keys": len(measured[0].waits_ms),
            "hot tasks": measured[0].tasks - len(measured[0].waits_ms),
            "p50 ms": median(p50s),
            "p50 ms rounds": p50s,
            "p99 ms": median(p99s),
            "p99 ms rounds": p99s,
            "waits ms": [w for r in measured for w in r.waits_ms],
        }
    return summary


def print_fairness(summary: dict) -> None:
    print("\nfairness: one-task keys submitted right after a hot key's backlog, their wait (start - submission):")
    for variant, s in summary.items():
        p50s = ", ".join(ms_text(x) for x in s["p50 ms rounds"])
        p99s = ", ".join(ms_text(x) for x in s["p99 ms rounds"])
        print(
            f"  {variant:<6} {s['keys']} keys behind {s['hot tasks']} hot-key tasks: "
            f"p50 {ms_text(s['p50 ms'])} ms ({p50s}), p99 {ms_text(s['p99 ms'])} ms ({p99s})"
        )


def ms_text(value: float) -> str:
    return f"{value:.1f}" if value < 100 else f"{value:.0f}"
