"""Submissions' rows, written in batches from what the gate keeps with each ticket.

A producer writes no row: its submission's record travels with the ticket in
the gate's one atomic call (``Gate.submit(record=...)``), so a producer killed
right after ``apply_async`` returned loses nothing. Every worker's main process
(``RecordWriter``), ``keyed_queue_reap`` and the operator's pages write those
rows: each writer claims keys, writes their records in one transaction, and
only then deletes them from the gate. The workers' passes write only records
older than ``KEYED_QUEUE_RECORD_DELAY_SECONDS``: a run that ends sooner writes
its row once, in its final state, from the record ``finish`` hands it
(``ended_with_record``), and one that starts sooner makes its row from its
own transition. Two writes of a row merge (see ``KeyedTaskManager.apply``),
in either order. A pass also hands the idempotency
keys of the superseded tasks it writes to the last replacement it knows of.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import redis
from django.db import close_old_connections

from ..conf import settings
from ..gate import Unwritten
from . import forks, idempotency
from .models import KeyedTask
from .statuses import ACTIVE_STATUSES, Status
from .transitions import Transition, outcome_field

if TYPE_CHECKING:
    from ..gate.views import RecordsGate

logger = logging.getLogger(__name__)

#: How long a writer's claim on a key lasts: another writer takes the key over after it.
CLAIM_SECONDS = 10.0
#: The most keys a web request writes before it answers (``write_page``): a
#: backlog left while no worker ran is the workers', the reaper's or ``keyed_queue_status``'s.
PAGE_BATCH = 500


_RECORD_FIELDS = ("task_id", "task_name", "arguments")


def encode_record(task_id: str, task_name: str, arguments: str) -> bytes:
    """What a submission keeps with its ticket for its row (the key, ticket and time are the gate's)."""
    return json.dumps({"task_id": task_id, "task_name": task_name, "arguments": arguments}).encode()


def transition(unwritten: Unwritten) -> Transition:
    """The row a kept record describes, as a transition that creates it; ValueError if it is not one.

    The gate's Redis may hold anything: the record is read as JSON only, and checked.
    """
    data = json.loads(unwritten.record)
    if not isinstance(data, dict) or not all(isinstance(data.get(f), str) for f in _RECORD_FIELDS):
        raise ValueError(f"not a keyed task submission record: {unwritten.record[:200]!r}")
    at = datetime.fromtimestamp(unwritten.at_ms / 1000, tz=UTC)
    create = {"task_name": data["task_name"], "enqueued_at": at, "arguments": data["arguments"]}
    message = unwritten.message.decode() if unwritten.message is not None else None
    if unwritten.superseded:  # ``at`` is when it was replaced; its submission's time is kept beside
        by, enqueued_ms = data.get("superseded_by"), data.get("enqueued_ms")
        if not isinstance(by, str) or not (
            enqueued_ms is None or (isinstance(enqueued_ms, str) and enqueued_ms.isdigit())
        ):
            raise ValueError(f"not a superseded submission's record: {unwritten.record[:200]!r}")
        if enqueued_ms is not None:
            create["enqueued_at"] = datetime.fromtimestamp(int(enqueued_ms) / 1000, tz=UTC)
        fields = {"finished_at": at, "superseded_by": by}
        return Transition(data["task_id"], unwritten.key, unwritten.ticket, Status.SUPERSEDED, 0, fields, create=create)
    granted = unwritten.granted
    return Transition(
        data["task_id"],
        unwritten.key,
        unwritten.ticket,
        Status.DISPATCHED if granted else Status.WAITING,
        0,
        {"dispatched_at": at} if granted else {},
        create=create,
        message=message,
    )


def ended_with_record(end: Transition, unwritten: Unwritten) -> Transition:
    """A run's end, with its submission's record that the gate still keeps (``Gate.finish`` hands it
    back): one row, written once, in its final state, its submission's own time and arguments. ``end``
    as it is if the record is not its submission's (it is then the writers' to refuse)."""
    try:
        submitted = transition(unwritten)
    except (ValueError, TypeError, OverflowError):
        return end
    if submitted.submission != end.submission or submitted.status == Status.SUPERSEDED:
        return end
    merged = submitted.merged_with(end)
    merged.create, merged.insert_first, merged.record_kept = submitted.create, True, True
    return merged


def write(gate: RecordsGate, keys: Sequence[str], claims: Sequence[tuple[str, int]] = (), *, young: bool = True) -> int:
    """Write the rows of the records kept for ``keys``, then delete those records and release
    ``claims``; returns how many were written. ``young=False``: only records older than the record
    delay; a key's younger ones are due again when the oldest of them is that old."""
    try:
        step = gate.unwritten(keys, young=young)
        found, rows = step.records, []
        for unwritten in found:
            try:
                rows.append(transition(unwritten))
            except (ValueError, TypeError, OverflowError):  # a time past a float's range is no time either
                logger.error(
                    "keyed queue key=%r keeps a submission record that is not one: %r", unwritten.key, unwritten
                )
        rows = _merged(rows)  # a ticket's submission record and its superseded one, read together
        if rows:  # a row the database refuses is set aside: it holds back no other, and is not tried again
            KeyedTask.objects.apply_setting_aside(rows, new=True)
        # Written again if this pass fails after: each hand-over is done once however often.
        for replaced, by in _replacements(rows).items():
            idempotency.repoint(replaced, by)
    except BaseException:
        gate.unclaim_unwritten(claims)  # the next pass, of any writer, tries them again
        raise
    # A key that keeps more records than one step reads is due again at once: the next pass writes on.
    # One whose younger records were left is due when they are as old as the delay.
    done = [c for c in claims if c[0] not in step.more and c[0] not in step.later]
    later = [(key, claim, step.later[key]) for key, claim in claims if key in step.later and key not in step.more]
    gate.forget_unwritten(found, done, later)
    gate.unclaim_unwritten([c for c in claims if c[0] in step.more])
    return len(rows)


def _replacements(rows: list[Transition]) -> dict[str, str]:
    """Each superseded task of ``rows`` with the last of the replacements they chain it to: the keys'
    hand-overs, in any order, leave none on a task another of these replaced (``idempotency.resolve``
    finds the end of a longer chain; the hand-overs only keep it short)."""
    by = {row.task_id: row.fields["superseded_by"] for row in rows if row.status == Status.SUPERSEDED}
    ends: dict[str, str] = {}
    for replaced in by:
        walked, task_id = [], replaced
        while task_id in by and task_id not in ends and task_id not in walked:  # a cycle, no real history's, ends it
            walked.append(task_id)
            task_id = by[task_id]
        end = ends.get(task_id, task_id)
        ends.update(dict.fromkeys(walked, end))
    return ends


def _merged(rows: list[Transition]) -> list[Transition]:
    """One transition per submission: its records merged, the later status winning."""
    by_submission: dict[tuple[str, str, int], Transition] = {}
    for row in rows:
        earlier = by_submission.get(row.submission)
        by_submission[row.submission] = earlier.merged_with(row) if earlier else row
    return list(by_submission.values())


def write_key(gate: RecordsGate, key: str) -> int:
    """Write now the rows of ``key``'s submissions kept in the gate (before acting on its rows): one
    step's worth; a deeper key's other records are written by the next pass of any writer."""
    return write(gate, [key])


def with_kept_end(gate: Callable[[], RecordsGate], row: KeyedTask) -> KeyedTask:
    """``row``, its run's end written first where the gate keeps one its worker has yet to write (within
    ``KEYED_QUEUE_RECORD_FLUSH_SECONDS``): a page or an action then sees the run ended, as the gate does
    (a key blocked by a failed task offers its retry). One read of the gate for a row whose run is under
    way (``gate`` makes the client only then: a cluster's connects as it is made); its worker still writes
    the end, which then changes nothing, and forgets it."""
    if row.status not in ACTIVE_STATUSES or row.ticket is None:
        return row
    try:
        kept = gate().kept_outcome(row.key, outcome_field(row.task_id, row.ticket))
    except redis.RedisError:
        return row  # the page says Redis is out of reach where it asks the gate itself
    if kept is None:
        return row
    try:
        end = Transition.from_json(kept)
    except ValueError:
        return row  # the reaper reports a kept outcome that is not a record
    if end.submission == (row.task_id, row.key, row.ticket):  # not another submission of this task id
        KeyedTask.objects.apply_setting_aside([end])
        row.refresh_from_db()
    return row


def write_page(gate: RecordsGate) -> int:
    """What a web request writes before it answers, so that it shows submissions made while no worker ran:
    one bounded batch (``PAGE_BATCH`` keys)."""
    return write_due(gate, batch=PAGE_BATCH, max_batches=1)


def write_due(gate: RecordsGate, *, batch: int = 500, max_batches: int = 100, young: bool = True) -> int:
    """Write the rows of the submissions kept in the gate, ``batch`` keys at a time, at most
    ``max_batches`` times; how many were written. ``young=False``: only of keys whose records are older
    than ``KEYED_QUEUE_RECORD_DELAY_SECONDS`` (the background passes: a run that ends first writes its
    row itself, once, in its final state)."""
    written = 0
    for _ in range(max_batches):
        claims = gate.claim_unwritten(claim_seconds=CLAIM_SECONDS, batch=batch, young=young)
        if claims:
            written += write(gate, [key for key, _ in claims], claims, young=young)
        if not claims:  # on a cluster, a batch is shared by the shards: one may hold more than its share
            break
    return written


def settle(
    gate: RecordsGate,
    task_id: str | None,
    key: str,
    ticket: int,
    status: str,
    *,
    unstarted: bool = False,
    **fields: Any,
) -> int:
    """``KeyedTask.objects.settle``, writing the key's kept submissions first if the row is not there yet."""
    changed = KeyedTask.objects.settle(task_id, key, ticket, status, unstarted=unstarted, **fields)
    if not changed:
        # Settled again whatever this write finds: another writer (an operator's page, a worker's pass)
        # may have written the row since, and forgets the kept record only once the row is in.
        write_key(gate, key)
        changed = KeyedTask.objects.settle(task_id, key, ticket, status, unstarted=unstarted, **fields)
    return changed


class RecordWriter:
    """A thread of a worker's main process writing submissions' rows every ``KEYED_QUEUE_RECORD_FLUSH_SECONDS``."""

    def __init__(self, gate: Callable[[], RecordsGate]) -> None:
        self._gate = gate
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="keyed-queue-submissions", daemon=True)

    def start(self) -> RecordWriter:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(settings.RECORD_FLUSH_SECONDS):
            with forks.held_off():
                self._pass()

    def _pass(self) -> None:
        try:
            if not write_due(self._gate(), young=False):
                # Kept open while there is work: reconnecting every pass costs a connection's set-up.
                close_old_connections()
        except Exception:  # Redis or the database is down: the records stay in the gate, try again
            logger.warning("keyed queue: writing submissions' rows failed; trying again", exc_info=True)
            close_old_connections()
