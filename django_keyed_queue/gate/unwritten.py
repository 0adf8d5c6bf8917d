"""Records the gate keeps until the database has them: submissions' records and finished runs' outcomes.

A producer writes no row: ``submit`` keeps the submission's record with its ticket, and the
workers' writers (``records/submissions.py``) claim keys of the unwritten index, read their
records, write the rows and forget them here. ``finish`` keeps a run's outcome the same way
until the worker's recorder wrote it (the reaper hands back those left too long).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from redis.typing import EncodableT

from .base import GateBase, reindex_calls, text
from .calls import ScriptCall, or_empty
from .keys import KeyNames
from .results import Unwritten, UnwrittenRecords
from .scripts import seconds_to_ms
from .transport import Command

#: About how many of one key's kept submission records one ``unwritten`` call reads: Redis' work per
#: call stays bounded however deep the key (100,000 parked once took one call 484 ms).
UNWRITTEN_PER_KEY = 500


class UnwrittenCalls(GateBase):
    """Claim keys holding unwritten records, read the records, forget those written."""

    def claim_unwritten(self, *, claim_seconds: float, batch: int = 500, young: bool = True) -> list[tuple[str, int]]:
        """Claim up to ``batch`` keys holding submission records not yet written, for ``claim_seconds``;
        on a cluster, up to ``batch / shards`` (rounded up) of each shard of the unwritten index.
        ``young=False``: only keys whose first record is older than the record delay (a writer's
        pass in the background: a run that ends within it writes its row itself, once).

        Returns (key, claim) pairs; other callers pass a claimed key by until
        :meth:`forget_unwritten` releases it or the claim lapses.
        """
        shards = self.unwritten_index.names
        share = -(-batch // len(shards))  # a share of each shard's
        # A second past the delay: the index is scored on the submitting host's clock.
        ahead_ms = self.record_delay_ms + 1000 if young and self.record_delay_ms else 0
        claim_ms = seconds_to_ms(claim_seconds)
        batch_calls = [
            claim_unwritten_call(shard, claim_ms=claim_ms, most_keys=share, ahead_ms=ahead_ms) for shard in shards
        ]
        replies = self._pipelined(batch_calls)
        return [(text(flat[i]), int(flat[i + 1])) for flat in replies for i in range(0, len(flat), 2)]

    def unwritten(
        self, keys: Sequence[str], *, per_key: int = UNWRITTEN_PER_KEY, young: bool = True
    ) -> UnwrittenRecords:
        """The submission records kept for ``keys``, with their tickets' messages, in one round trip: about
        ``per_key`` of each key (a bounded step of Redis' work); ``more`` names the keys that keep others.
        ``young=False``: only records older than the record delay; ``young`` then names the keys that keep
        younger ones, with when they are due."""
        min_age_ms = 0 if young else self.record_delay_ms
        batch = [
            unwritten_call(key, count=per_key, keep_ms=self.idle_horizon_ms, min_age_ms=min_age_ms) for key in keys
        ]
        found, more, later = [], set(), {}
        for key, (left, oldest_young, *flat) in zip(keys, self._pipelined(batch), strict=True):
            if left:
                more.add(key)
            if int(oldest_young):
                later[key] = int(oldest_young) + self.record_delay_ms
            for field, kept, message in zip(flat[0::3], flat[1::3], flat[2::3], strict=True):
                found.append(Unwritten.read(key, field, kept, message or None))
        return UnwrittenRecords(found, frozenset(more), later)

    def kept_since(self, tickets: Sequence[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """When the gate took each of ``tickets`` ((key, ticket) pairs; server ms), of those whose submission's
        record it still keeps (until their rows are written). One round trip; reads only."""
        if not tickets:
            return {}
        pipe = self.client.pipeline(transaction=False)
        for key, ticket in tickets:
            pipe.hget(KeyNames(key).unwritten, str(ticket))
        found = {}
        for pair, kept in zip(tickets, pipe.execute(), strict=True):
            parts = kept.split(b"|", 2) if kept else []  # as submit.lua keeps it; anything else is passed by
            if len(parts) == 3 and parts[1].isdigit():
                found[pair] = int(parts[1])
        return found

    def replacement(self, key: str, task_id: str, *, ticket: int | None = None, max_hops: int) -> tuple[str, int]:
        """The task that replaced ``task_id`` of ``key`` while it waited (coalescing), the one that replaced that
        one, and so on, as far as the superseded records kept here until their rows are written tell, at most
        ``max_hops`` on: (the last one's id, how many replacements led to it); (``task_id``, 0) if none is kept.
        ``ticket``: the task's, if known (else found among the key's recent submissions). Reads only."""
        found, hops = self._call(replacement_call(key, task_id=task_id, ticket=ticket, max_hops=max_hops))
        return text(found), int(hops)

    def unclaim_unwritten(self, claims: Iterable[tuple[str, int]]) -> None:
        """Give back ``claims`` (from :meth:`claim_unwritten`) whose records were not written: due again at once."""
        if batch := reindex_calls(self.unwritten_index, moves=((key, claim, 0) for key, claim in claims)):
            self._pipelined(batch)

    def forget_unwritten(
        self,
        written: Iterable[Unwritten],
        claims: Iterable[tuple[str, int]] = (),
        later: Iterable[tuple[str, int, int]] = (),
    ) -> None:
        """Delete records whose rows are written, release ``claims`` (from :meth:`claim_unwritten`) of keys
        no submission was kept for since, and move those of ``later`` ((key, claim, ms when due)) to when
        their younger records are due; one round trip."""
        # Deleted first (on one server; a cluster's masters each take theirs): a claim released before
        # its records were deleted would leave them unindexed, until the key's next submission.
        deleted: list[Command] = [("HDEL", KeyNames(w.key).unwritten, w.field or w.ticket) for w in written]
        moves = [*((key, claim, -1) for key, claim in claims), *later]  # -1: removed
        released = reindex_calls(self.unwritten_index, moves=moves)
        if released:
            self._pipelined(released, before=deleted)
        elif deleted:
            self._run(deleted)

    def kept_outcome(self, key: str, field: str) -> bytes | None:
        """The record of a run's end kept with ``key`` under ``field`` until its worker writes it, if any."""
        (kept,) = self._run([("HGET", KeyNames(key).outcomes, field)])
        return kept.partition(b"|")[2] if kept is not None else None  # "<finished ms>|<record>"

    def forget_outcomes(self, written: Iterable[tuple[str, str]], *, records: Iterable[tuple[str, int]] = ()) -> None:
        """Delete the outcomes of runs whose records are written: (key, task id) pairs, and the submission
        records of ``records`` ((key, ticket) pairs) whose rows a run wrote itself; one round trip.

        A record's key stays in the unwritten index: a writer's next pass finds it empty and drops it (a
        submission made meanwhile may have indexed it again)."""
        fields: dict[str, list[EncodableT]] = {}  # each hash's fields, deleted in one command
        for key, task_id in written:
            fields.setdefault(KeyNames(key).outcomes, []).append(task_id)
        for key, ticket in records:
            fields.setdefault(KeyNames(key).unwritten, []).append(ticket)
        if fields:
            self._run([("HDEL", name, *deleted) for name, deleted in fields.items()])


def claim_unwritten_call(shard: str, *, claim_ms: int, most_keys: int, ahead_ms: int) -> ScriptCall:
    """``claim_unwritten.lua``'s call on ``shard``: one name of the unwritten index (see :class:`~.keys.Index`)."""
    return ScriptCall("claim_unwritten", [shard], [claim_ms, most_keys, ahead_ms])


def unwritten_call(key: str, *, count: int, keep_ms: int, min_age_ms: int = 0) -> ScriptCall:
    n = KeyNames(key)
    return ScriptCall("unwritten", [n.unwritten, n.messages, n.scan_cursors], [count, keep_ms, min_age_ms])


def replacement_call(key: str, *, task_id: str, ticket: int | None, max_hops: int) -> ScriptCall:
    n = KeyNames(key)
    return ScriptCall("replacement", [n.unwritten, n.recent, n.recent_older], [task_id, or_empty(ticket), max_hops])
