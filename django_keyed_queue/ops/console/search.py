"""What the task list's search box finds for a term: the lookups ``TaskSearch`` reads through indexes."""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence
from dataclasses import dataclass

from django.db import connections
from django.db.models import Exists, OuterRef, Q, QuerySet

from ...gate import MAX_KEY_LENGTH
from ...records import queries
from ...records.columns import TASK_ID_MAX_LENGTH, TASK_NAME_MAX_LENGTH
from ...records.key_words import KEY_SEPARATORS, has_separator
from ...records.models import KeyWord

#: A task id's start is searched from this many characters: 4 hex digits narrow a million random ids
#: to about 15 rows, where fewer would add tasks picked by chance to a key's or a name's rows.
TASK_ID_PREFIX_MIN = 4
#: A term's separators are read only as the keys that exist spell them, and at most this many ways.
KEY_READINGS_MAX = 32
#: A term's first this many separators each stand for any separator (one query each); later ones are read
#: as typed. So a term costs at most this many queries of ``KEY_READINGS_MAX`` seeks per separator, however
#: long: 199 characters of "x x x ..." cost 99 such queries, seconds against keys of many words (bench.admin_pages).
FLEXIBLE_SEPARATORS_MAX = 6
#: Task names are read (one index seek each) up to this many; a project has far fewer.
TASK_NAMES_MAX = 5000
#: A word's keys are read up to this many; a word of more keys is matched row by row as the page
#: walks ``-id`` (its rows are then many, and a page of them is soon found).
WORD_KEYS_MAX = 500


@dataclass(frozen=True)
class TermLookup:
    """One thing a search matches: a field's whole value, or its start (``prefix``); or a later word of
    the key (``word``): one of ``keys``, the keys that have it, or with ``keys`` None (more than
    ``WORD_KEYS_MAX``) any key that ``KeyWord`` gives it."""

    field: str
    value: str
    prefix: bool = False
    word: bool = False
    keys: tuple[str, ...] | None = None

    @property
    def whole(self) -> bool:
        """A whole value: read in page order from its field's ``(field, -id)`` index."""
        return not (self.prefix or self.word)

    @property
    def unresolved(self) -> bool:
        return self.word and self.keys is None


class TaskSearch:
    """What the search box finds for one term: the rows of every kind it matches (a union).

    - a task id, whole or its first ``TASK_ID_PREFIX_MIN`` or more characters;
    - a key, whole or its first words up to a separator, where each separator in the term stands
      for any of ``KEY_SEPARATORS`` ("account" and "account:" find account:6, "account 6" finds
      account:6 but not account:60); the text as typed, spaces and all, also matches a whole key;
    - a key by any later word, for a term of one word (no separator): "1001" finds ledger:1001 and
      tenant:5:ledger:1001, not ledger:10010 or ledger:1001x. A word is the text between two
      separators, or after the last: the words of ledger:1001:eu are ledger, 1001 and eu;
    - a task name, whole or its last dotted parts ("send_invoice" finds shop.tasks.send_invoice).

    Case-sensitive, as keys are in the gate. ``lookups`` keeps only those some row matches, found
    by index seeks. Each is an equality or a prefix, read as one range of an index: on SQLite
    ``>= 'ab' AND < 'ac'`` (its LIKE ignores case, and no index serves it); elsewhere LIKE 'ab%',
    escaped, which PostgreSQL reads from a ``varchar_pattern_ops`` index. A later word is read from
    ``KeyWord``'s (word, key) index, which the records' writers fill once per key (``key_words``):
    whole words, not any piece of a key, so that an index holds them on every database and the
    writes cost a row per key, not per task.
    """

    def __init__(self, tasks: QuerySet, typed: str) -> None:
        self.tasks = tasks.order_by()  # lookups of a set: no ORDER BY for the database to honour
        self.db = connections[tasks.db]
        self.typed = typed
        self.term = typed.strip()
        # No record holds NUL, and PostgreSQL takes none even to compare (Django's search form refuses it first).
        self.lookups: list[TermLookup] = self._read() if self.term and "\x00" not in typed else []

    def condition(self, column: str = "{}", lookups: Sequence[TermLookup] | None = None) -> Q:
        """What a row matched by ``lookups`` (by default all) satisfies (no lookup: nothing); ``column``
        names each field's column."""
        chosen = self.lookups if lookups is None else lookups
        return functools.reduce(operator.or_, (self._q(lookup, column) for lookup in chosen), Q(pk__in=[]))

    def _read(self) -> list[TermLookup]:
        candidates = []
        if len(self.term) <= TASK_ID_MAX_LENGTH:
            candidates.append(TermLookup("task_id", self.term, prefix=len(self.term) >= TASK_ID_PREFIX_MIN))
        if self.typed != self.term and len(self.typed) <= MAX_KEY_LENGTH:
            candidates.append(TermLookup("key", self.typed))  # a key that itself begins or ends with spaces
        if len(self.term) <= MAX_KEY_LENGTH:
            candidates += self._key_readings()
        word = self._later_word() if len(self.term) <= MAX_KEY_LENGTH else []
        # A word of more than WORD_KEYS_MAX keys has rows; a probe of it would walk the table.
        found = self._present(candidates + [lookup for lookup in word if not lookup.unresolved])
        found += [lookup for lookup in word if lookup.unresolved]
        names = self._task_names() if len(self.term) <= TASK_NAME_MAX_LENGTH else []
        return found + [TermLookup("task_name", n) for n in names if n == self.term or n.endswith("." + self.term)]

    def _key_readings(self) -> list[TermLookup]:
        """The term with each of its first ``FLEXIBLE_SEPARATORS_MAX`` separators read as any separator, where
        a key begins so: one query per such separator. Each reading is a whole key, or the start of one up to
        a separator."""
        readings, flexible = [""], FLEXIBLE_SEPARATORS_MAX
        for char in self.term:
            if char in KEY_SEPARATORS and flexible:
                flexible -= 1
                spelt = self._present([TermLookup("key", r + s, prefix=True) for r in readings for s in KEY_SEPARATORS])
                readings = [lookup.value for lookup in spelt][:KEY_READINGS_MAX]
                if not readings:
                    return []
            else:
                readings = [r + char for r in readings]
        if self.term[-1] in KEY_SEPARATORS:  # "account:": the keys that go on after account and a separator
            return [TermLookup("key", r, prefix=True) for r in readings]
        return [TermLookup("key", r) for r in readings] + [
            TermLookup("key", r + s, prefix=True) for r in readings for s in KEY_SEPARATORS
        ]

    def _later_word(self) -> list[TermLookup]:
        """A term of one word: the keys that have it after their first word, from ``KeyWord``'s index.
        (A key's first words are its readings, ``_key_readings``.)"""
        if has_separator(self.term):
            return []
        words = KeyWord.objects.using(self.tasks.db).filter(word=self.term).order_by()
        keys = list(words.values_list("key", flat=True)[: WORD_KEYS_MAX + 1])
        if len(keys) > WORD_KEYS_MAX:
            return [TermLookup("key", self.term, word=True)]
        if len(keys) == 1:
            return [TermLookup("key", keys[0])]
        return [TermLookup("key", self.term, word=True, keys=tuple(sorted(keys)))] if keys else []

    def _present(self, lookups: list[TermLookup]) -> list[TermLookup]:
        """Those of ``lookups`` that some row matches, in one query: an index seek each."""
        if not lookups:
            return []
        probes = [self.tasks.filter(self._q(lookup)).values("pk")[:1].query.sql_with_params() for lookup in lookups]
        with self.db.cursor() as cursor:
            cursor.execute(queries.exists_sql([sql for sql, _ in probes]), [p for _, params in probes for p in params])
            found = cursor.fetchone()
        return [lookup for lookup, exists in zip(lookups, found, strict=True) if exists]

    def _task_names(self) -> list[str]:
        """Every task name that has records, in one query that seeks each in the task name index
        (a loose index scan; DISTINCT would read the whole index)."""
        with self.db.cursor() as cursor:
            cursor.execute(queries.task_names_sql(self.db.alias), [TASK_NAMES_MAX])
            return [row[0] for row in cursor.fetchall()]

    def _q(self, lookup: TermLookup, column: str = "{}") -> Q:
        name = column.format(lookup.field)
        if lookup.keys is not None:
            return Q((f"{name}__in", lookup.keys))
        if lookup.word:  # one seek of the (word, key) index per row
            return Q(Exists(KeyWord.objects.filter(word=lookup.value, key=OuterRef(name))))
        if not lookup.prefix:
            return Q((name, lookup.value))
        if self.db.vendor != "sqlite":
            return Q((f"{name}__startswith", lookup.value))
        above = _above_every_text_beginning(lookup.value)
        return Q((f"{name}__gte", lookup.value)) & (Q((f"{name}__lt", above)) if above else Q())


def _above_every_text_beginning(prefix: str) -> str | None:
    """The least text above every text that begins with ``prefix`` (in code point order, which is
    SQLite's for UTF-8); None if there is none (the prefix is all U+10FFFF)."""
    stem = prefix.rstrip("\U0010ffff")
    if not stem:
        return None
    code = ord(stem[-1]) + 1
    if 0xD800 <= code <= 0xDFFF:
        code = 0xE000  # surrogates are not text: the next character is U+E000
    return stem[:-1] + chr(code)
