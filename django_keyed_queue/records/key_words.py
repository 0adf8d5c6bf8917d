"""The later words of keys, for the admin's search: a key is found by any of its words, not only its first.

The search reads a key's first words from the key index, as a range (``account`` finds
``account:6``). A later word (the ``1001`` of ``ledger:1001``) is in the middle of its key, where
no index of the records can find it. ``KeyWord`` keeps one row per (word, key) for each word
after a key's first, and ``remember`` writes them when the records' writer makes a key's row:

- Once per key, not per task: a process remembers the last ``KNOWN_KEYS_MAX`` keys whose words
  it wrote (or that have none), and skips them. A key seen again costs a set lookup.
- In the row's own transaction, so no commit is added, in a savepoint: a refused word is
  logged and holds back no record.
- Nothing is deleted: the words of a key whose rows are gone find no rows.

Measured with a new key every task (docs/benchmarks.md): about 0.02 ms more per row written on
PostgreSQL, nothing measurable on SQLite.

Why not an index of the records table: a trigram index (PostgreSQL's ``pg_trgm``) or a full-text
one (SQLite's FTS5, kept by triggers) is written for every row, where most rows' keys were met
before; ``pg_trgm`` needs an extension that a migration may not be allowed to create, and FTS5 is
not in every SQLite build. Both would also be two designs, one per database.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable
from functools import partial

from django.db import DatabaseError, connections, transaction

from . import queries

logger = logging.getLogger(__name__)

#: The characters that part a key's words: in a search each stands for any of them, one for one
#: ("account 6" finds account:6 and account/6). Not % or \: a search takes them as they are.
KEY_SEPARATORS = " :/-_.|#,;=+@"
_SEPARATOR = re.compile("[" + re.escape(KEY_SEPARATORS) + "]")
#: Rows one INSERT writes at most: 500 parameters, under every SQLite build's limit.
ROWS_PER_INSERT = 250
#: Keys a process remembers as written: about 160 bytes each for a 25-character key, 1.6 MB in all.
KNOWN_KEYS_MAX = 10_000


def words(text: str) -> list[str]:
    """The words of ``text``, between its separators (``KEY_SEPARATORS``), in order."""
    return [word for word in _SEPARATOR.split(text) if word]


def later_words(key: str) -> list[str]:
    """The words of ``key`` after its start (the text up to its first separator), each once: ``ledger:1001``
    has ``1001``, `` lead:1`` (a space first) has ``lead`` and ``1``, ``report`` has none."""
    return sorted({word for word in _SEPARATOR.split(key)[1:] if word})


def has_separator(text: str) -> bool:
    return _SEPARATOR.search(text) is not None


class KnownKeys:
    """The keys whose words a process wrote, per database, the oldest forgotten first past ``most``."""

    def __init__(self, most: int = KNOWN_KEYS_MAX) -> None:
        self._most = most
        self._keys: dict[tuple[str, str], None] = {}
        self._lock = threading.Lock()  # the records' writer threads of one process share it

    def missing(self, alias: str, keys: Iterable[str]) -> list[str]:
        with self._lock:
            return [key for key in keys if (alias, key) not in self._keys]

    def add(self, alias: str, keys: Iterable[str]) -> None:
        with self._lock:
            self._keys.update(dict.fromkeys((alias, key) for key in keys))
            while len(self._keys) > self._most:
                del self._keys[next(iter(self._keys))]

    def clear(self) -> None:
        with self._lock:
            self._keys.clear()


KNOWN = KnownKeys()


def remember(alias: str, keys: Iterable[str]) -> None:
    """Write the later words of those of ``keys`` this process has not written to ``alias``, inside the
    caller's transaction; they count as written once it commits."""
    new = KNOWN.missing(alias, set(keys))
    if not new:
        return
    rows = sorted({(word, key) for key in new for word in later_words(key)})  # one order: no deadlock
    if rows:
        try:
            with transaction.atomic(using=alias), connections[alias].cursor() as cursor:  # a savepoint
                for start in range(0, len(rows), ROWS_PER_INSERT):  # one statement, not one per row
                    chunk = rows[start : start + ROWS_PER_INSERT]
                    cursor.execute(
                        queries.key_words_insert_sql(alias, len(chunk)), [value for row in chunk for value in row]
                    )
        except DatabaseError:
            logger.warning("the words of %d keys were not written for the search", len(new), exc_info=True)
            return
    transaction.on_commit(partial(KNOWN.add, alias, new), using=alias)
