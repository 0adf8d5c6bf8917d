"""Keys whose records say unfinished while the gate holds nothing of them: listed apart on the live keys page.

Redis decides and the rows record, so such rows run nothing: Redis lost the keys (a restart
without persistence, a flush, a failover that lost writes), or something wrote the rows without
the gate (a test, a benchmark, a restored database). They are found from the oldest unfinished rows
of each status, a bounded read of the status index, then checked against the gate in one round trip.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import datetime

from django.db.models import Count

from ..gate import Gate
from ..records.models import KeyedTask
from ..records.statuses import ACTIVE_STATUSES
from .display import since

#: How many of the oldest unfinished rows of each status are read to find such keys.
ROWS_READ = 200


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


def unheld_keys(
    gate: Gate,
    *,
    limit: int,
    live: Collection[str] = (),
    matches: Callable[[str], bool] | None = None,
    also: str | None = None,
) -> tuple[list[UnheldKey], bool]:
    """At most ``limit`` keys whose rows say unfinished while the gate holds nothing of them, the oldest
    first, and whether there may be more. Rows without a ticket are left out: a delayed task joins its
    key's queue when due (its message is with the broker until then).

    Read from the ``ROWS_READ`` oldest unfinished rows of each status, those of the keys in ``live``
    (shown live already) passed over; with ``matches``, only keys it takes; ``also``: one key looked up
    whole besides. Four reads of the status index, one of the key index for ``also``, one round trip to
    the gate, and one count of the shown keys' rows.
    """
    oldest: dict[str, datetime] = {}
    full = False
    for status in ACTIVE_STATUSES:
        rows = (
            KeyedTask.objects.filter(status=status, ticket__isnull=False)
            .exclude(key__in=list(live))
            .order_by("id")
            .values_list("key", "enqueued_at")[:ROWS_READ]
        )
        read = list(rows)
        full = full or len(read) == ROWS_READ
        for key, enqueued_at in read:
            if (matches is None or matches(key)) and (key not in oldest or enqueued_at < oldest[key]):
                oldest[key] = enqueued_at
    if also is not None and also not in live:
        first = KeyedTask.objects.filter(key=also, status__in=ACTIVE_STATUSES, ticket__isnull=False)
        if at := first.order_by("id").values_list("enqueued_at", flat=True).first():
            oldest[also] = min(at, oldest.get(also, at))
    held_nothing = gate.holding_nothing(list(oldest)) if oldest else set()
    found = sorted((UnheldKey(k, at) for k, at in oldest.items() if k in held_nothing), key=lambda u: (u.oldest, u.key))
    shown = {u.key: u for u in found[:limit]}
    counts = (
        KeyedTask.objects.filter(key__in=list(shown), status__in=ACTIVE_STATUSES, ticket__isnull=False)
        .values_list("key", "status")
        .annotate(n=Count("id"))
        .order_by()
    )
    for key, status, n in counts if shown else ():
        shown[key].unfinished[status] = n
    # A row that finished since it was read (its run's record written meanwhile) is not one.
    return [u for u in shown.values() if u.unfinished], full or len(found) > limit
