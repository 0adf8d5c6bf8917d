"""The oldest unfinished rows' keys, and those of them the gate holds nothing of: listed apart on the live page.

Redis decides and the rows record, so rows that say unfinished for a key Redis holds nothing of run
nothing: Redis lost the key (a restart without persistence, a flush, a failover that lost writes),
or something wrote the rows without the gate (a test, a benchmark, a restored database). The oldest
unfinished rows of each status are a bounded read of the status index; the live page checks their
keys in the gate: a key with work there is live (its rows tell the longest waits), one with nothing
is listed apart.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import datetime

from ...records.models import KeyedTask
from ...records.statuses import ACTIVE_STATUSES
from ..display import since

#: How many of the oldest unfinished rows of each status the live page reads.
ROWS_READ = 100


@dataclass
class RowsRead:
    """The oldest unfinished rows' keys: each one's oldest submission and its rows read (their ids)."""

    oldest: dict[str, datetime] = field(default_factory=dict)
    ids: dict[str, list[int]] = field(default_factory=dict)
    full: bool = False  # a status had more rows than were read


@dataclass
class UnheldKey:
    """A key with unfinished rows and nothing in the gate."""

    key: str
    oldest: datetime  # the oldest of its unfinished rows' submissions
    unfinished: dict[str, int] = field(default_factory=dict)  # status -> its rows read that are still so

    @property
    def rows(self) -> int:
        return sum(self.unfinished.values())

    @property
    def waited_for(self) -> str | None:
        return since(self.oldest)


def oldest_unfinished(
    *, passed: Collection[str] = (), matches: Callable[[str], bool] | None = None, also: str | None = None
) -> RowsRead:
    """The keys of the ``ROWS_READ`` oldest unfinished rows of each status. Rows without a ticket are left
    out: a delayed task joins its key's queue when due (its message is with the broker until then).

    The keys of ``passed`` (known already) are passed over, so that a deep key does not fill the read;
    with ``matches``, only keys it takes; ``also``: one key whose oldest rows are read besides. Four
    reads of the status index (and one of the key index for ``also``).
    """
    read = RowsRead()
    queries = [
        KeyedTask.objects.filter(status=status, ticket__isnull=False).exclude(key__in=list(passed))
        for status in ACTIVE_STATUSES
    ]
    if also is not None and also not in passed:
        queries.append(KeyedTask.objects.filter(key=also, status__in=ACTIVE_STATUSES, ticket__isnull=False))
    for i, query in enumerate(queries):
        rows = list(query.order_by("id").values_list("id", "key", "enqueued_at")[:ROWS_READ])
        read.full = read.full or (len(rows) == ROWS_READ and i < len(ACTIVE_STATUSES))
        for pk, key, enqueued_at in rows:
            if matches is None or matches(key) or key == also:
                read.oldest[key] = min(enqueued_at, read.oldest.get(key, enqueued_at))
                read.ids.setdefault(key, []).append(pk)
    return read


def unheld(read: RowsRead, keys: Collection[str], *, limit: int) -> list[UnheldKey]:
    """The oldest ``limit`` of ``keys`` (of ``read``, which the gate holds nothing of), with their rows read
    that still say unfinished, by status: one query, by the rows' ids (a row that finished since it was
    read, its run's record written meanwhile, is not counted; a key left with none is not listed)."""
    oldest = sorted(keys, key=lambda k: (read.oldest[k], k))[:limit]
    ids = [pk for key in oldest for pk in read.ids[key]]
    still = KeyedTask.objects.filter(pk__in=ids, status__in=ACTIVE_STATUSES).values_list("key", "status")
    counts = Counter(still) if ids else Counter()
    shown = [UnheldKey(k, read.oldest[k], {s: n for (key, s), n in sorted(counts.items()) if key == k}) for k in oldest]
    return [u for u in shown if u.unfinished]
