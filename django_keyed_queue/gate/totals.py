"""The deployment's totals for the metrics: counters and histograms summed over every process.

Each process counts in memory and adds what it counted here every second or so; a scrape of
any process reads the sums. Field names are opaque here (``process/totals.py`` makes and reads
them). Both hashes share a slot, so one round trip writes them on a Redis Cluster too.
"""

from __future__ import annotations

from collections.abc import Mapping

from .base import GateBase, texts
from .keys import TOTALS, TOTALS_TEMPLATES
from .transport import Command


class TotalsCalls(GateBase):
    def add_totals(self, amounts: Mapping[str, int | float], templates: Mapping[str, str] | None = None) -> None:
        """Add ``amounts`` (field -> int, or float for a sum) to the totals, and note each task's key template."""
        commands: list[Command] = [
            ("HINCRBY" if isinstance(amount, int) else "HINCRBYFLOAT", TOTALS, field, amount)
            for field, amount in amounts.items()
        ]
        if templates:
            commands.append(("HSET", TOTALS_TEMPLATES, *(v for pair in templates.items() for v in pair)))
        if commands:
            self._run(commands)

    def totals(self) -> tuple[dict[str, str], dict[str, str]]:
        """Every total (field -> its number as Redis keeps it) and every task's key template."""
        amounts, templates = self._run([("HGETALL", TOTALS), ("HGETALL", TOTALS_TEMPLATES)])
        return texts(amounts), texts(templates)
