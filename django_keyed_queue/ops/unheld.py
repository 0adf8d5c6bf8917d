"""The oldest unfinished rows' keys, and those of them the gate holds nothing of: listed apart on the live page.

Redis decides and the rows record, so rows that say unfinished for a key Redis holds nothing of run
nothing: Redis lost the key (a restart without persistence, a flush, a failover that lost writes),
or something wrote the rows without the gate (a test, a benchmark, a restored database). The oldest
unfinished rows of each status are a bounded read of the status index; the live page checks their
keys in the gate: a key with work there is live (its rows tell the longest waits), one with nothing
is listed apart.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import datetime

from django.db.models import Count

from ..records.models import KeyedTask
from ..records.statuses import ACTIVE_STATUSES
from .display import since

#: How many of the oldest unfinished rows of each status the live page reads.
ROWS_READ = 100


@dataclass
class UnheldKey:
    """A key with unfinished rows and nothing in the gate."""

    key: str
    oldest: datetime  # the oldest of its unfinished rows' submissions
    unfinished: dict[str, int] = field(default_factory=dict)  # status -> rows

    @property
    def rows(self) -> int:
        return sum(self.unfinished.values())

    @property
    def waited_for(self) -> str | None:
        return since(self.oldest)


def oldest_unfinished(
    *, passed: Collection[str] = (), matches: Callable[[str], bool] | None = None, also: str | None = None
) -> tuple[dict[str, datetime], bool]:
    """The keys of the ``ROWS_READ`` oldest unfinished rows of each status, with each one's oldest submission
    read, and whether a status had more. Rows without a ticket are left out: a delayed task joins its key's
    queue when due (its message is with the broker until then).

    The keys of ``passed`` (known already) are passed over, so that a deep key does not fill the read;
    with ``matches``, only keys it takes; ``also``: one key looked up whole besides. Four reads of the
    status index (and one of the key index for ``also``).
    """
    oldest: dict[str, datetime] = {}
    full = False
    for status in ACTIVE_STATUSES:
        rows = (
            KeyedTask.objects.filter(status=status, ticket__isnull=False)
            .exclude(key__in=list(passed))
            .order_by("id")
            .values_list("key", "enqueued_at")[:ROWS_READ]
        )
        read = list(rows)
        full = full or len(read) == ROWS_READ
        for key, enqueued_at in read:
            if (matches is None or matches(key)) and (key not in oldest or enqueued_at < oldest[key]):
                oldest[key] = enqueued_at
    if also is not None and also not in passed:
        first = KeyedTask.objects.filter(key=also, status__in=ACTIVE_STATUSES, ticket__isnull=False)
        if at := first.order_by("id").values_list("enqueued_at", flat=True).first():
            oldest[also] = min(at, oldest.get(also, at))
    return oldest, full


def unheld(found: dict[str, datetime], *, limit: int) -> list[UnheldKey]:
    """The oldest ``limit`` of ``found`` (keys the gate holds nothing of, with their oldest row's time), with
    their unfinished rows counted by status (one query, through the key index)."""
    shown = {k: UnheldKey(k, at) for k, at in sorted(found.items(), key=lambda item: (item[1], item[0]))[:limit]}
    if not shown:
        return []
    counts = (
        KeyedTask.objects.filter(key__in=list(shown), status__in=ACTIVE_STATUSES, ticket__isnull=False)
        .values_list("key", "status")
        .annotate(n=Count("id"))
        .order_by()
    )
    for key, status, n in counts:
        shown[key].unfinished[status] = n
    # A row that finished since it was read (its run's record written meanwhile) is not one.
    return [u for u in shown.values() if u.unfinished]
