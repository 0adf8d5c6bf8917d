"""Every SQL statement the package sends that Django's ORM does not build, in one home (the records'
writes and reads, the task list's search): the ORM builds the rest, where it is as fast.

Each is built once per database (and per size of a list it takes), with the database's own quoting, and
takes its values as parameters, never in its text (but for constants: the lock waits, whole numbers, and
the statuses' ranks).
"""

from __future__ import annotations

from functools import cache
from typing import Any, cast

from django.db import connections, models
from django.db.models.constants import OnConflict

from .columns import FREE_TEXT
from .statuses import STATUS_RANK
from .transitions import FIELDS

#: SQLite's wait for a lock held by another connection, read.
SQLITE_BUSY_TIMEOUT = "PRAGMA busy_timeout"


def sqlite_busy_timeout_sql(ms: int) -> str:
    """SQLite's wait for a lock held by another connection, set (the connection's, until set again)."""
    return f"PRAGMA busy_timeout = {int(ms)}"


def postgresql_lock_timeout_sql(ms: int) -> str:
    """PostgreSQL's wait for a lock, for the rest of the transaction."""
    return f"SET LOCAL lock_timeout = {int(ms)}"


@cache
def waiting_since_sql(model: type[models.Model], alias: str, pairs: int) -> str:
    """The rows of ``pairs`` (key, ticket) pairs, joined from a list of them: Django's ORM would build an OR
    of as many conditions (slow to build, and a tree SQLite refuses past 1000 deep)."""
    qn = connections[alias].ops.quote_name
    table = qn(model._meta.db_table)
    wanted = ", ".join(["(%s, CAST(%s AS BIGINT))"] * pairs)
    columns = ", ".join(f"t.{qn(c)}" for c in ("id", "key", "ticket", "status", "enqueued_at", "due_at"))
    # CROSS JOIN: SQLite then loops over the list and seeks each key in its index (with JOIN it read the
    # whole table, 1.9 s at a million rows); PostgreSQL plans it as any join.
    return (
        f"WITH wanted (wanted_key, wanted_ticket) AS (VALUES {wanted})"
        f" SELECT {columns} FROM wanted CROSS JOIN {table} t"
        f" WHERE t.{qn('key')} = wanted.wanted_key AND t.{qn('ticket')} = wanted.wanted_ticket"
    )


@cache
def replacement_sql(model: type[models.Model], alias: str) -> str:
    """A recursive query: each step finds the next task through the task id index (a scalar subquery, so
    that SQLite, its statistics gathered, does not make each step a scan of the table for a Bloom filter).
    A step whose task has no row, or whose latest row names no replacement, gives NULL or '': the last."""
    qn = connections[alias].ops.quote_name
    table, id_, task_id = qn(model._meta.db_table), qn("id"), qn("task_id")
    # TEXT on both sides: PostgreSQL wants a recursive term's columns typed as its first term's.
    return (
        f"WITH RECURSIVE chain (task_id, hops) AS ("
        f" SELECT CAST(%(task_id)s AS TEXT), 0"
        f" UNION ALL SELECT (SELECT CAST(t.{qn('superseded_by')} AS TEXT) FROM {table} t"
        f" WHERE t.{task_id} = c.task_id ORDER BY t.{id_} DESC LIMIT 1), c.hops + 1"
        f" FROM chain c WHERE c.hops < %(max_hops)s AND c.task_id <> '')"
        f" SELECT e.task_id, e.hops, t.{qn('key')}, t.{qn('ticket')}, t.{qn('status')}"
        f" FROM (SELECT task_id, hops FROM chain WHERE task_id <> '' ORDER BY hops DESC LIMIT 1) e"
        f" LEFT JOIN {table} t ON t.{id_} = (SELECT MAX(n.{id_}) FROM {table} n WHERE n.{task_id} = e.task_id)"
    )


@cache
def update_sql(model: type[models.Model], alias: str) -> str:
    """One UPDATE for any transition, run with executemany over a batch.

    A transition that moves the row forward sets its fields; one that does not
    (it arrived late) only fills fields still empty, so no timestamp is lost.
    """
    qn = connections[alias].ops.quote_name
    rank = "CASE {} {} END".format(
        qn("status"), " ".join(f"WHEN '{status}' THEN {r}" for status, r in STATUS_RANK.items())
    )
    # Named parameters: each value is sent once however often the statement uses it.
    forward = f"({qn('attempts')} < %(attempts)s OR ({qn('attempts')} = %(attempts)s AND {rank} <= %(rank)s))"
    sets = [
        f"{qn(f)} = CASE WHEN {forward} THEN COALESCE(%({f})s, {qn(f)}) ELSE COALESCE({qn(f)}, %({f})s) END"
        for f in FIELDS
    ]
    sets.append(f"{qn('ticket')} = COALESCE({qn('ticket')}, %(ticket)s)")  # a join's row gets its ticket
    message = qn("message")
    sets.append(f"{message} = CASE WHEN {message} = '' THEN COALESCE(%(message)s, '') ELSE {message} END")
    # Status and attempts last: every SET must see the row as it was.
    sets += [f"{qn(f)} = CASE WHEN {forward} THEN %({f})s ELSE {qn(f)} END" for f in ("status", "attempts")]
    # A submission's row: its task id, key and ticket; a delayed task's join also finds its row without a ticket.
    where = (
        f"{qn('task_id')} = %(task_id)s AND {qn('key')} = %(key)s"
        f" AND ({qn('ticket')} = %(ticket)s OR (%(joins)s = 1 AND {qn('ticket')} IS NULL))"
    )
    return f"UPDATE {qn(model._meta.db_table)} SET {', '.join(sets)} WHERE {where}"


@cache
def insert_sql(model: type[models.Model], alias: str, *, ignore_conflicts: bool) -> str:
    """The row INSERT, doing nothing on a conflict if ``ignore_conflicts``; built once per database."""
    ops = connections[alias].ops
    fields = insert_fields(model)
    columns = ", ".join(ops.quote_name(cast(str, f.column)) for f, _, _ in fields)  # a concrete field has a column
    placeholders = ", ".join(["%s"] * len(fields))
    on_conflict = OnConflict.IGNORE if ignore_conflicts else None
    table = ops.quote_name(model._meta.db_table)
    suffix = ops.on_conflict_suffix_sql([f for f, _, _ in fields], on_conflict, [], [])
    return f"{ops.insert_statement(on_conflict)} {table} ({columns}) VALUES ({placeholders}) {suffix}".strip()


@cache
def insert_fields(model: type[models.Model]) -> tuple[tuple[models.Field[Any, Any], Any, bool], ...]:
    """The INSERT's fields, each with its default (constants: no field has a callable default) and
    whether it is free text."""
    return tuple((f, f.get_default(), f.name in FREE_TEXT) for f in model._meta.concrete_fields if not f.primary_key)


@cache
def key_words_insert_sql(alias: str, rows: int) -> str:
    from .models import KeyWord

    ops = connections[alias].ops
    meta = KeyWord._meta
    fields = [meta.get_field("word"), meta.get_field("key")]
    columns = ", ".join(ops.quote_name(cast(str, f.column)) for f in fields)  # a concrete field has a column
    table, suffix = ops.quote_name(meta.db_table), ops.on_conflict_suffix_sql(fields, OnConflict.IGNORE, [], [])
    values = ", ".join(["(%s, %s)"] * rows)
    return f"{ops.insert_statement(OnConflict.IGNORE)} {table} ({columns}) VALUES {values} {suffix}".strip()


@cache
def task_names_sql(alias: str) -> str:
    """Every task name of the rows, at most ``%s`` of them, each found by a seek of the task name index (a
    loose index scan; DISTINCT would read the whole index)."""
    from .models import KeyedTask

    quote, meta = connections[alias].ops.quote_name, KeyedTask._meta
    table, name = (
        quote(meta.db_table),
        quote(cast(str, cast("models.Field[Any, Any]", meta.get_field("task_name")).column)),
    )
    return (
        f"WITH RECURSIVE names(name) AS (SELECT MIN({name}) FROM {table} UNION ALL"
        f" SELECT (SELECT MIN({name}) FROM {table} WHERE {name} > names.name) FROM names"
        " WHERE names.name IS NOT NULL) SELECT name FROM names WHERE name IS NOT NULL LIMIT %s"
    )


def exists_sql(subqueries: list[str]) -> str:
    """One row of whether each of ``subqueries`` (the ORM's, with their parameters in order) finds a row."""
    return "SELECT " + ", ".join(f"EXISTS({sql})" for sql in subqueries)
