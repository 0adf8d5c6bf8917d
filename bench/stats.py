"""The one median and the one percentile of every benchmark, so that a p99 means the same in each report.

Percentiles are on a 0..100 scale: ``percentile(samples, 99)``, never ``0.99``.
"""

from __future__ import annotations

from collections.abc import Iterable


def median(values: Iterable[float]) -> float:
    """The middle value; the mean of the two middle values of an even count."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("median of no values")
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def percentile(values: Iterable[float], percent: float) -> float:
    """The value at 0-based position ``floor(percent / 100 * n)`` of the ``n`` sorted values (the last at 100).

    ``percent`` is from 1 to 100. The 50th is the upper of the two middle values of an even count, where
    ``median`` takes their mean.
    """
    # A fraction passed for a percent (0.95 for 95) would quietly report the minimum: refuse it.
    if not 1 <= percent <= 100:
        raise ValueError(f"percent is on a 0..100 scale (95, not 0.95): got {percent}")
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of no values")
    return ordered[min(len(ordered) - 1, int(percent * len(ordered) / 100))]
