"""How the operator's pages and commands write a moment and a span of time: one format each, everywhere.

A moment: ``2026-11-26 13:42:57.381 UTC``, in the current time zone, named; to the millisecond,
since tasks of one key often start and end within the same second. A span: ``381 ms``,
``12.3 s``, ``1 min 33 s``, ``2 h 5 min``, ``3 d 4 h``. The pages tick spans that still grow
(``since.html``, which writes them as :func:`took` does).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.utils import timezone

from ..rates import RATE_PERIODS_MS, rate_interval_ms


def at(value: datetime | None) -> str | None:
    """A moment in the current time zone, to the millisecond, with the zone's name."""
    if value is None:
        return None
    local = timezone.localtime(value)
    return f"{local:%Y-%m-%d %H:%M:%S}.{local.microsecond // 1000:03d} {local:%Z}"


def took(span: timedelta | float | None) -> str | None:
    """A span of time, in the unit that reads best."""
    if span is None:
        return None
    seconds = max(span.total_seconds() if isinstance(span, timedelta) else float(span), 0.0)
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes = round(seconds) // 60
    if minutes < 60:
        return f"{minutes} min {round(seconds) % 60} s"
    hours = minutes // 60
    return f"{hours} h {minutes % 60} min" if hours < 24 else f"{hours // 24} d {hours % 24} h"


def since(value: datetime | None) -> str | None:
    """How long ago ``value`` was, as :func:`took` writes it."""
    return None if value is None else took(timezone.now() - value)


def epoch_ms(value: datetime | None) -> int | None:
    """``value`` for the pages' script that ticks a span (``data-since``)."""
    return None if value is None else int(value.timestamp() * 1000)


def from_epoch(seconds: float | None) -> datetime | None:
    """A moment the gate gives as seconds since the epoch (Redis' clock)."""
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC)


#: What a task is or did, by its status, as a sentence about it says it ("it was cancelled").
_DID = {
    "waiting": "waits",
    "dispatched": "is dispatched",
    "running": "is running",
    "retrying": "is retrying",
    "succeeded": "succeeded",
    "failed": "failed",
    "cancelled": "was cancelled",
    "ignored": "was ignored",
    "rejected": "was rejected",
    "superseded": "was superseded",
}


def did(status: str) -> str:
    """``status`` as the verb of a sentence about the task: "succeeded", "was cancelled", "is running"."""
    return _DID.get(status, f"is {status}")


def last_line(error: str) -> str:
    """The line of an error that names it (a traceback's last), for a summary; "" for none."""
    lines = [line.strip() for line in error.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def rate_said(interval_ms: int) -> str:
    """The least ms between two starts as the rate an operator types ("2/h", "30/m", "3/s"): the rate whose
    interval it is (``rate_interval_ms``), in the shortest period that has one; else the interval itself."""
    for period, period_ms in RATE_PERIODS_MS.items():
        count = round(period_ms / interval_ms)
        if count >= 1 and rate_interval_ms(f"{count}/{period}") == interval_ms:
            return f"{count}/{period}"
    return f"one start every {interval_ms} ms"
