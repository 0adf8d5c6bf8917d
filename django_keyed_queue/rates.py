"""Rates as the settings and the decorator take them, ``"N/s"`` (or ``/m``, ``/h``), in the gate's terms:
the least time between two starts, in whole ms."""

from __future__ import annotations

#: ``rate=``'s periods, in ms.
RATE_PERIODS_MS = {"s": 1000, "m": 60_000, "h": 3_600_000}
#: The fastest rate the gate keeps: it spaces starts by a whole number of ms, at least 1.
MAX_RATE = "1000/s"


def rate_interval_ms(rate: str | None) -> int:
    """The least time between two starts (of one key, or of a pool), in ms, for ``rate="N/s"`` (``/m``,
    ``/h``); 0 for None.

    Rounded up, so the gate never starts more often than ``rate`` says (``"3/s"``: 334 ms; ``"700/s"``:
    2 ms, 500 a second). A rate faster than one start a millisecond is refused, naming ``MAX_RATE``:
    the gate could not keep it.
    """
    if rate is None:
        return 0
    count, _, period = rate.partition("/") if isinstance(rate, str) else ("", "", "")
    if not (count.isascii() and count.isdigit() and count.strip("0") and period in RATE_PERIODS_MS):
        raise ValueError(f'rate must be "N/s", "N/m" or "N/h" with N a whole number >= 1, got {rate!r}')
    period_ms, digits = RATE_PERIODS_MS[period], count.lstrip("0")
    if len(digits) > len(str(period_ms)) or int(digits) > period_ms:  # no int() of a 5,000-digit text
        raise ValueError(
            f"rate must be at most {MAX_RATE} (60000/m, 3600000/h): the gate spaces starts by whole "
            f"milliseconds, got {rate[:40]!r}"
        )
    return -(-period_ms // int(digits))
