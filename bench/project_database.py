"""The user project's database read straight from the benchmark (sqlite3 or psycopg), not through its Django:
its keyed records, its stored results, its accounts, a peer's jobs."""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from contextlib import closing
from pathlib import Path

from testproject.servers import PostgresServer

#: Each table that holds a row per task, by ``task_id``, with a ``status``: the keyed records, and
#: django-celery-results' stored results.
KEYED_RECORDS = "keyed_queue_keyedtask"
STORED_RESULTS = "django_celery_results_taskresult"


class ProjectDatabase:
    """The project's SQLite file, or its PostgreSQL database ``name`` on ``postgres``."""

    def __init__(self, sqlite_path: Path, postgres: PostgresServer | None = None, name: str = "") -> None:
        self.sqlite_path = sqlite_path
        self.postgres = postgres
        self.name = name

    def statuses(self, table: str, ids: list[str]) -> Counter:
        """How many rows of ``table`` (one per task) of the tasks ``ids`` have each status, plus ``missing``."""
        if self.postgres is None:
            where, param = "task_id IN (SELECT value FROM json_each(?))", json.dumps(ids)  # the ids as one JSON text
        else:
            where, param = "task_id = ANY(%s)", ids
        rows = self.rows(f"SELECT status, COUNT(*) FROM {table} WHERE {where} GROUP BY status", [param])
        return with_missing(Counter(dict(rows)), ids)

    def value(self, query: str) -> int:
        """The one value ``query`` selects (a query without parameters, the same in both dialects)."""
        return self.rows(query, [])[0][0]

    def rows(self, query: str, params: list) -> list[tuple]:
        """``query``'s rows, its parameters in the database's own style: ``?`` for SQLite, ``%s`` for PostgreSQL."""
        if self.postgres is None:
            with closing(sqlite3.connect(self.sqlite_path, timeout=30)) as db:  # `with` alone leaves it open
                return db.execute(query, params).fetchall()
        with self.pg_connection() as conn:
            return conn.execute(query, params).fetchall()

    def execute(self, statement: str) -> None:
        """One statement in autocommit (PostgreSQL's ``ANALYZE``, which a transaction refuses)."""
        with self.pg_connection() as conn:
            conn.execute(statement)

    def pg_connection(self):  # a psycopg.Connection (imported here: only the PostgreSQL runs need it)
        import psycopg

        pg = self.postgres
        assert pg is not None
        return psycopg.connect(host=str(pg.directory), port=pg.port, user=pg.user, dbname=self.name, autocommit=True)


def with_missing(counts: Counter, ids: list) -> Counter:
    """``counts`` of statuses, plus ``missing``: the ids that have no row."""
    counts["missing"] = len(ids) - sum(counts.values())
    return +counts
