"""Every read helper and every write of keyed task records, through the project's database routers.

Rows are written in three ways, each a method here:

- ``insert_submission``: a delayed submission's row, written by its producer (a raw INSERT);
- ``apply``: transitions, forward only: a write applies only if it moves the row to
  a later attempt, or to a later status of the same attempt; one with ``create``
  makes the row when there is none (a submission's row, written from the gate by
  ``submissions``, or a worker that got there first);
- ``settle``: recovery's word, which overrides any status but a terminal one.

The first two also write, in the same transaction, the later words of a key they have not met
before, for the admin's search (``key_words``).

The database is ``router.db_for_write(KeyedTask)``: with ``KeyedQueueRouter`` in
``DATABASE_ROUTERS``, ``KEYED_QUEUE_DATABASE`` (see ``router``).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, nullcontext
from datetime import datetime
from functools import cache
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar, cast

from django.db import DataError, IntegrityError, connections, models, router, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models.functions import Concat
from django.utils import timezone

from . import forks, key_words, queries
from .columns import FREE_TEXT, shown, storable_text
from .statuses import ACTIVE_STATUSES, STATUS_RANK, TERMINAL_STATUSES, Status
from .transitions import FIELDS, Transition

if TYPE_CHECKING:
    from ..gate import KeySnapshot

    # Named as a string in the generic bases below: .models imports this module.
    from .models import KeyedTask  # noqa: F401

logger = logging.getLogger(__name__)
T = TypeVar("T")


#: Pairs one query of ``waiting_since`` looks up (two parameters each), task ids one of ``holding`` or
#: ``_rows_there`` does: under the 999 parameters of older SQLite builds.
PAIRS_PER_QUERY = 400

#: What a database raises for one row's values (NUL in text, a value over its column's length, a
#: constraint): that row is refused, and the database still serves the others.
ROW_REFUSED = (DataError, IntegrityError)

#: PostgreSQL's SQLSTATE for a lock not granted within ``lock_timeout``.
LOCK_NOT_AVAILABLE = "55P03"


def gave_way_to_a_lock(error: BaseException) -> bool:
    """Whether ``error`` is a write that stopped waiting for a lock another transaction holds
    (``apply``'s ``lock_wait``), rather than a failure of the database."""
    cause = error.__cause__
    sqlstate = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)  # psycopg 3, psycopg2
    return sqlstate == LOCK_NOT_AVAILABLE or "database is locked" in str(error)


class KeyedTaskQuerySet(models.QuerySet["KeyedTask"]):
    def active(self) -> KeyedTaskQuerySet:
        return self.with_status(*ACTIVE_STATUSES)

    def with_status(self, *statuses: str) -> KeyedTaskQuerySet:
        """The rows in ``statuses``, found through the status index whatever the query adds to it.

        With the statuses bound as parameters, SQLite's planner reads the whole table in key order for
        a GROUP BY key, a DISTINCT or an ORDER BY key (the live keys page took 16 s, a rebuild's read
        2.6 s, at a million rows); finding the rows' ids first takes about a millisecond.
        """
        return self.filter(pk__in=self.model._default_manager.filter(status__in=statuses).values("pk"))

    def waited_longest_seconds(self) -> float:
        """How long the longest-waiting of these tasks has waited; 0 when none waits."""
        return seconds_since(self.with_status(Status.WAITING).aggregate(at=models.Min("enqueued_at"))["at"])

    def for_key(self, key: str) -> KeyedTaskQuerySet:
        return self.filter(key=key)

    def holding(self, snapshots: Iterable[KeySnapshot]) -> dict[tuple[str, int], KeyedTask]:
        """The records of the tasks that hold the snapshots' slots, by key and ticket (a query per ``PAIRS_PER_QUERY``
        holders, through the task id index).

        A holder is matched by its message's task id, never by its ticket alone: a key's tickets start
        over once it drains, and its older records keep theirs. Of one id, the latest row (Celery reuses
        an id for a replacement). A holder whose message names no task has no record here.
        """
        held = {(s.key, ticket, h.task_id) for s in snapshots for ticket, h in s.holders.items() if h.task_id}
        ids = sorted({task_id for _, _, task_id in held})
        found: dict[tuple[str, int], KeyedTask] = {}
        for start in range(0, len(ids), PAIRS_PER_QUERY):  # found through the task id index, then checked here
            rows = self.filter(task_id__in=ids[start : start + PAIRS_PER_QUERY]).defer("message", "arguments")
            found.update({(t.key, t.ticket): t for t in rows.order_by("id") if (t.key, t.ticket, t.task_id) in held})  # type: ignore[misc]  # a holder's row has its ticket
        return found

    def waiting_since(self, tickets: Iterable[tuple[str, int]]) -> dict[tuple[str, int], datetime]:
        """When each of ``tickets`` ((key, ticket) pairs) began to wait for its key, as its row says: its due
        time if it was delayed, else its submission. A key's tickets start over once it drains, so of the rows
        of one pair the latest unfinished one speaks, else the latest. A query per ``PAIRS_PER_QUERY`` pairs,
        each pair found through the key index."""
        pairs = list(dict.fromkeys(tickets))
        found: dict[tuple[str, int], tuple[bool, int, datetime]] = {}
        for start in range(0, len(pairs), PAIRS_PER_QUERY):
            chunk = pairs[start : start + PAIRS_PER_QUERY]
            sql = queries.waiting_since_sql(self.model, self.db, len(chunk))
            for row in self.raw(sql, [value for pair in chunk for value in pair]):
                pair, rank = (
                    (row.key, cast(int, row.ticket)),
                    (row.status in ACTIVE_STATUSES, row.pk, row.due_at or row.enqueued_at),
                )
                if pair not in found or rank[:2] > found[pair][:2]:
                    found[pair] = rank
        return {pair: since for pair, (_, _, since) in found.items()}

    def replacement(self, task_id: str, *, max_hops: int) -> Replacement:
        """The end of the chain of replacements the rows record from ``task_id``: its latest row's
        ``superseded_by``, that task's, and so on, at most ``max_hops`` on, in one query (a recursive one).
        A task id Celery reused stands for its latest row, as its AsyncResult does."""
        with connections[self.db].cursor() as cursor:
            cursor.execute(queries.replacement_sql(self.model, self.db), {"task_id": task_id, "max_hops": max_hops})
            found = cursor.fetchone()
        return Replacement(*found) if found else Replacement(task_id, 0, None, None, None)  # '': no task


class Replacement(NamedTuple):
    """Where a chain of replacements ends, as the rows tell (``KeyedTaskQuerySet.replacement``)."""

    task_id: str
    #: How many replacements led there (0: the task itself).
    hops: int
    #: Its latest row's key, ticket and status; None if its row is not written.
    key: str | None
    ticket: int | None
    status: str | None


def seconds_since(at: datetime | None) -> float:
    """Seconds from ``at`` to now, to the ms (0 for None, and for a time ahead of this host's clock)."""
    return round(max(0.0, (timezone.now() - at).total_seconds()), 3) if at else 0.0


# Named, not called in the class statement: django-stubs types a manager made from a queryset only so.
_KeyedTaskManagerBase = models.Manager.from_queryset(KeyedTaskQuerySet)


def _holding_off_forks(write: Callable[..., T]) -> Callable[..., T]:
    """A write of the records holds off forks of this process while it runs (see ``forks.py``)."""

    @functools.wraps(write)
    def held(manager: Any, *args: Any, **kwargs: Any) -> T:
        with forks.held_off():
            return write(manager, *args, **kwargs)

    return held


class KeyedTaskManager(_KeyedTaskManagerBase["KeyedTask"]):
    def db_for_write(self) -> str:
        return router.db_for_write(self.model)

    @_holding_off_forks
    def insert_submission(self, **row: Any) -> None:
        """Write a new submission's row now (the producer's one synchronous write).

        A granted ticket can run, and its worker create the row from the message,
        before this write commits; then the row is already there and only the
        submission's own facts are added.
        """
        row.setdefault("enqueued_at", timezone.now())
        db = connections[self.db_for_write()]
        sql = queries.insert_sql(self.model, db.alias, ignore_conflicts=False)
        params = _insert_params(self.model, db, row)
        try:
            # A savepoint only inside the caller's transaction: in autocommit the INSERT is atomic alone.
            with transaction.atomic(using=db.alias) if db.in_atomic_block else nullcontext():
                with db.cursor() as cursor:
                    cursor.execute(sql, params)
                key_words.remember(db.alias, [row["key"]])
        except IntegrityError:
            ticket = row.get("ticket")
            made_by_worker = self.using(db.alias).filter(task_id=row["task_id"], key=row["key"], ticket=ticket)
            if ticket is None or not made_by_worker.update(enqueued_at=row["enqueued_at"], arguments=row["arguments"]):
                raise

    @_holding_off_forks
    def apply(
        self,
        *transitions: Transition,
        new: bool = False,
        create_after: float | None = None,
        lock_wait: float | None = None,
    ) -> list[Transition]:
        """Apply transitions now, in one transaction; each moves its submission's row forward or fills its gaps,
        and one with ``create`` makes the row if there is none yet (``new``: rows are expected to be missing,
        so each is inserted first, and updated only if it was there).

        ``create_after``: a row is made only for a transition whose row has been missing
        (``missing_since``) for that many seconds; the others are returned, applied to nothing.
        A worker's transitions wait so for the submission's row its writer is about to write.

        Every writer (the workers' buffers, the submissions' writers) writes one way (``_write``), each
        statement taking its rows in the submissions' order, so that concurrent writers mostly wait for
        each other. Two statements of one batch may still meet another writer's in the opposite order:
        PostgreSQL then aborts one of the two transactions, and its writer writes that batch again.

        ``lock_wait``: seconds to wait for a lock another transaction holds, then raise
        (``gave_way_to_a_lock``); by default the database's own wait.
        """
        db = connections[self.db_for_write()]
        ordered = sorted(transitions, key=lambda t: t.submission)
        with _transaction(db, lock_wait) as cursor:
            waiting = _write(db, cursor, self.model, ordered, new=new, create_after=create_after, now=time.monotonic())
            # Words after rows, in every writer: two writers never wait for each other in turn.
            waited = {id(t) for t in waiting}
            key_words.remember(db.alias, [t.key for t in ordered if t.create is not None and id(t) not in waited])
        return waiting

    def apply_setting_aside(
        self,
        transitions: list[Transition],
        *,
        new: bool = False,
        create_after: float | None = None,
        lock_wait: float | None = None,
    ) -> list[Transition]:
        """``apply``, so that a row the database refuses holds back no other: if the batch is refused,
        each transition is applied alone, and one refused alone is set aside, with an error logged
        once, naming its task and key. An error of the database itself is raised."""
        try:
            return self.apply(*transitions, new=new, create_after=create_after, lock_wait=lock_wait)
        except ROW_REFUSED as exc:
            if len(transitions) == 1:
                _set_aside(transitions[0], exc)
                return []
        waiting = []
        for t in transitions:
            try:
                waiting += self.apply(t, new=new, create_after=create_after, lock_wait=lock_wait)
            except ROW_REFUSED as exc:
                _set_aside(t, exc)
        return waiting

    def settle(
        self, task_id: str | None, key: str, ticket: int, status: str, *, unstarted: bool = False, **fields: Any
    ) -> int:
        """Set a submission's status now, whatever it was, unless it already ended (recovery's write).

        Recovery knows better than the buffered writes of a worker it gave up on;
        a record that reached a terminal status keeps it. ``task_id`` None: the ticket's
        row, whatever its task (a stored message too malformed to name it). ``unstarted``: only a row
        still waiting or dispatched (a run that started meanwhile keeps its own). Returns how many rows changed.
        """
        rows = self.filter(key=key, ticket=ticket)
        if unstarted:
            rows = rows.filter(status__in=(Status.WAITING, Status.DISPATCHED))
        return self._settle(rows if task_id is None else rows.filter(task_id=task_id), status, fields)

    @_holding_off_forks
    def note_running(self, task_id: str, key: str, ticket: int, **fields: Any) -> int:
        """Set ``fields`` of a submission's row while it is dispatched or running (a note on a run that
        has not ended, such as its process lost); a row that moved on keeps its own. How many changed."""
        rows = self.filter(task_id=task_id, key=key, ticket=ticket, status__in=(Status.DISPATCHED, Status.RUNNING))
        return rows.using(self.db_for_write()).update(**fields)

    @_holding_off_forks
    def note(self, task_id: str, key: str, ticket: int, line: str) -> int:
        """Append ``line`` to the notes of submission ``(task_id, key, ticket)`` (an atomic append in the
        database: a racing write of its status or error keeps it). How many rows took it."""
        field = self.model._meta.get_field("notes")
        text = storable_text(field, line)
        rows = self.filter(task_id=task_id, key=key, ticket=ticket).using(self.db_for_write())
        return rows.update(notes=Concat(models.F("notes"), models.Value(text + "\n"), output_field=models.TextField()))

    def note_attempt(
        self, task_id: str, key: str, ticket: int, attempt: int, how: str, ended: datetime,
        ran: tuple[str, datetime] | None = None,
    ) -> int:  # fmt: skip
        """Note how attempt ``attempt`` ended, a line of the record's notes that its later attempts keep: which
        worker ran it and from when (``ran``; None: its worker died before its record said), how and when."""
        where = " (its worker died before its record said where it ran)"
        if ran is not None:
            where = f" on {ran[0] or 'an unnamed worker'}, started {ran[1].isoformat(timespec='milliseconds')}"
        line = f"attempt {attempt}{where} ended {ended.isoformat(timespec='milliseconds')}: {how}"
        return self.note(task_id, key, ticket, line)

    def note_ran_on(self, task_id: str, key: str, ticket: int, attempt: int, began: datetime, ended: datetime) -> None:
        """Attempt ``attempt`` lost its key (released, or its lease expired) and ran on until ``ended``: its
        record says so, and how long it ran beside the attempt after it, as that one's record has it."""
        later = self.filter(task_id=task_id, key=key, ticket=ticket).values_list("attempts", "started_at").first()
        said = f"attempt {attempt} ran on after it lost its key: {began:%H:%M:%S} to {ended:%H:%M:%S} UTC"
        if later is not None and later[0] > attempt and later[1] is not None and later[1] < ended:
            beside = (ended - max(later[1], began)).total_seconds()
            said += f", {beside:.1f} s of it beside attempt {later[0]} (started {later[1]:%H:%M:%S})"
        self.note(task_id, key, ticket, said)

    @_holding_off_forks
    def renumber(self, key: str, moves: dict[tuple[str, int], int]) -> int:
        """Give submissions of ``key`` new tickets: ((task id, ticket) -> new ticket), as a rebuild numbered
        them again in the gate (``Gate.restore_ahead``); a row not written yet takes its new ticket from the
        gate's record of it. How many rows changed."""
        changed = 0
        for (task_id, ticket), new in moves.items():
            rows = self.filter(key=key, task_id=task_id, ticket=ticket).using(self.db_for_write())
            changed += rows.update(ticket=new)
        return changed

    def settle_rows(self, pks: Iterable[int], status: str, **fields: Any) -> int:
        """``settle`` for rows an operator's action or a rebuild has in hand."""
        return self._settle(self.filter(pk__in=list(pks)), status, fields)

    @_holding_off_forks
    def _settle(self, rows: models.QuerySet[Any], status: str, fields: dict[str, Any]) -> int:
        unfinished = rows.using(self.db_for_write()).exclude(status__in=TERMINAL_STATUSES)
        fields = {
            name: storable_text(self.model._meta.get_field(name), value)  # type: ignore[arg-type]  # a concrete field
            if name in FREE_TEXT and isinstance(value, str)
            else value
            for name, value in fields.items()
        }
        return unfinished.update(status=status, **fields)


@contextmanager
def _transaction(db: BaseDatabaseWrapper, lock_wait: float | None) -> Iterator[Any]:
    """A transaction on ``db`` and its cursor, waiting at most ``lock_wait`` seconds for a lock another
    transaction holds (None: the database's own wait). SQLite's wait is the connection's: set before
    ``BEGIN`` (which takes the lock in ``IMMEDIATE`` mode) and given back after. PostgreSQL's is the
    transaction's own."""
    wait_ms = None if lock_wait is None else max(1, round(lock_wait * 1000))
    sqlite_before = _sqlite_busy_timeout_ms(db, wait_ms) if wait_ms is not None and db.vendor == "sqlite" else None
    try:
        with transaction.atomic(using=db.alias), db.cursor() as cursor:
            if wait_ms is not None and db.vendor == "postgresql":
                cursor.execute(queries.postgresql_lock_timeout_sql(wait_ms))
            yield cursor
    finally:
        if sqlite_before is not None:
            _sqlite_busy_timeout_ms(db, sqlite_before)


def _sqlite_busy_timeout_ms(db: BaseDatabaseWrapper, ms: int) -> int:
    """Set the SQLite connection's wait for a lock; the wait it had."""
    with db.cursor() as cursor:
        cursor.execute(queries.SQLITE_BUSY_TIMEOUT)
        (before,) = cursor.fetchone()
        cursor.execute(queries.sqlite_busy_timeout_sql(ms))
    return int(before)


def _write(
    db: BaseDatabaseWrapper,
    cursor: Any,
    model: type[models.Model],
    ordered: list[Transition],
    *,
    new: bool,
    create_after: float | None,
    now: float,
) -> list[Transition]:
    """Apply ``ordered``, a statement for many rows: the one way every writer writes; those that must
    wait for their rows are returned.

    Each row is guessed there or missing (``_inserted_first``): one UPDATE for those guessed there, one
    INSERT for the others. An UPDATE that did not find a row each is followed by one read of which
    rows are there: those there are updated again (an update repeats safely, and a row another writer
    made meanwhile takes it), the missing ones that may make their rows join the INSERT, and the rest
    wait. A busy worker's flush holds both kinds (runs that started after the record delay, their rows
    not written yet): a statement a row would cost it every flush. What an INSERT met another writer's
    row for, and a join (its row may have no ticket yet), go one by one.
    """
    alone = [t for t in ordered if t.joins]
    inserts = [t for t in ordered if not t.joins and _inserted_first(t, new)]
    updates = [t for t in ordered if not t.joins and not _inserted_first(t, new)]
    waiting: list[Transition] = []
    update = queries.update_sql(model, db.alias)
    if updates:
        cursor.executemany(update, [_update_params(model, t, db) for t in updates])
        # Of those that missed their rows, one without ``create`` has nothing to make.
        creating = [t for t in updates if t.create is not None] if cursor.rowcount != len(updates) else []
        there = _rows_there(db, model, creating) if creating else set()
        if again := [t for t in creating if t.submission in there]:
            cursor.executemany(update, [_update_params(model, t, db) for t in again])
        for t in creating:
            if t.submission not in there:
                (waiting if _waits_for_its_row(t, create_after, now) else inserts).append(t)
    if inserts:
        insert = queries.insert_sql(model, db.alias, ignore_conflicts=True)
        cursor.executemany(insert, [_insert_params(model, db, t.row_to_create()) for t in inserts])
        if cursor.rowcount != len(inserts):  # another writer made some: each again, alone (its insert is ignored)
            alone += inserts
    return waiting + _one_by_one(db, cursor, model, sorted(alone, key=lambda t: t.submission), new, create_after, now)


def _rows_there(db: BaseDatabaseWrapper, model: type[models.Model], transitions: list[Transition]) -> set[Any]:
    """The submissions (task id, key, ticket) of ``transitions`` whose rows are there."""
    ids = sorted({t.task_id for t in transitions})
    rows = model._default_manager.using(db.alias).order_by()
    found: set[Any] = set()
    for start in range(0, len(ids), PAIRS_PER_QUERY):
        chunk = rows.filter(task_id__in=ids[start : start + PAIRS_PER_QUERY])
        found.update(chunk.values_list("task_id", "key", "ticket"))
    return found


def _one_by_one(
    db: BaseDatabaseWrapper,
    cursor: Any,
    model: type[models.Model],
    ordered: list[Transition],
    new: bool,
    create_after: float | None,
    now: float,
) -> list[Transition]:
    """Apply each of ``ordered`` alone: its update, or its insert if its row is missing (first, if it is most
    likely missing); those that must wait for their rows are returned."""
    waiting: list[Transition] = []
    update = queries.update_sql(model, db.alias)
    insert = queries.insert_sql(model, db.alias, ignore_conflicts=True)
    for t in ordered:
        params = _update_params(model, t, db)
        if not _inserted_first(t, new):
            cursor.execute(update, params)
            if cursor.rowcount or t.create is None:
                continue
            if _waits_for_its_row(t, create_after, now):
                waiting.append(t)
                continue
        cursor.execute(insert, _insert_params(model, db, t.row_to_create()))
        if not cursor.rowcount:  # another writer's row came first: apply this to it
            cursor.execute(update, params)
    return waiting


def _waits_for_its_row(t: Transition, create_after: float | None, now: float) -> bool:
    """Whether ``t``, its row missing, waits for the writers to write it rather than make it now: until it
    has been missing ``create_after`` seconds (``apply``'s)."""
    return create_after is not None and (t.missing_since is None or now - t.missing_since < create_after)


def _inserted_first(t: Transition, new: bool) -> bool:
    """Whether ``t``'s row is most likely missing, so that it is inserted first (and updated only if it
    was there): in a batch of new rows, or a transition that says so (``Transition.insert_first``)."""
    return t.create is not None and (new or t.insert_first)


def _set_aside(t: Transition, error: Exception) -> None:
    task_name = (t.create or {}).get("task_name", "a keyed task")
    logger.error(
        "the record of %s[%s] key=%s ticket=%s is refused by the database and set aside (%s: %s): %r",
        task_name, shown(t.task_id), shown(t.key), t.ticket, type(error).__name__, error, t,
    )  # fmt: skip


@cache
def _fields(model: type[models.Model]) -> tuple[tuple[str, models.Field[Any, Any]], ...]:
    return tuple((name, model._meta.get_field(name)) for name in FIELDS)  # type: ignore[misc]


def _update_params(model: type[models.Model], t: Transition, db: BaseDatabaseWrapper) -> dict[str, Any]:
    given = t.fields
    params = {name: _db_value(db, model_field, given.get(name)) for name, model_field in _fields(model)}
    params.update(status=t.status, attempts=t.attempts, rank=STATUS_RANK[t.status])
    params.update(task_id=t.task_id, key=t.key, ticket=t.ticket, joins=int(t.joins), message=t.message)
    return params


#: Values a column takes as they are (``_db_value``'s first case, told by type alone: a row has about 25).
_AS_IS = frozenset((str, int, bool, type(None)))


def _insert_params(model: type[models.Model], db: BaseDatabaseWrapper, row: dict[str, Any]) -> list[Any]:
    params = []
    for f, default, free in queries.insert_fields(model):
        value = row.get(f.attname, default)
        params.append(value if type(value) in _AS_IS and not free else _db_value(db, f, value))
    return params


def _db_value(db: BaseDatabaseWrapper, model_field: models.Field[Any, Any], value: Any) -> Any:
    # Text, numbers and None go to the driver as they are; an aware datetime needs only the
    # backend's conversion (the field's own checks cost twice as much, on every write).
    if isinstance(value, str) and model_field.name in FREE_TEXT:
        return storable_text(model_field, value)
    if value is None or isinstance(value, (str, int)):
        return value
    if isinstance(value, datetime) and value.tzinfo is not None:
        return db.ops.adapt_datetimefield_value(value)
    return model_field.get_db_prep_save(value, db)
