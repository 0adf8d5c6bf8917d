"""The keyed task list in the admin: filters and pagination that stay fast at millions of rows."""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence
from dataclasses import dataclass

from celery import current_app
from django.contrib import admin, messages
from django.contrib.admin.views.main import ORDER_VAR, SEARCH_VAR, ChangeList
from django.db import connections
from django.db.models import CharField, Exists, F, Func, OuterRef, Q, QuerySet
from django.http import HttpResponseRedirect
from django.utils.http import urlencode
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from ..gate import MAX_KEY_LENGTH
from ..records.columns import TASK_ID_MAX_LENGTH, TASK_NAME_MAX_LENGTH
from ..records.key_words import KEY_SEPARATORS, has_separator
from ..records.models import KeyWord
from .query_string import check_lookups

#: ``?cursor=<id>``: the page of rows older than that id (the "Older" link).
CURSOR_VAR = "cursor"
#: ``?before=<id>``: the page of rows just newer than that id (the "Newer" link).
BEFORE_VAR = "before"
CURSOR_PARAMS = (CURSOR_VAR, BEFORE_VAR)
#: Sent by the search box alone (its hidden field, in change_list.html): a search that finds one task
#: opens its page. A link that carries the search (a filter, a page, the task page's "Close") does not.
SEARCH_BOX_VAR = "_searched"
#: Dropped from the query like Django drops its page number: sorting is always by ``-id``, and
#: facet counts are never shown (Django 4.2, which has no facets, would take ``_facets`` for a lookup).
_DROPPED = (*CURSOR_PARAMS, ORDER_VAR, "_facets", SEARCH_BOX_VAR)
_MAX_ID = 2**63 - 1  # a bigint; a larger value would overflow the database driver


class TaskNameFilter(admin.SimpleListFilter):
    """The registered keyed tasks that have records, each found through the (task_name, -id) index:
    not a DISTINCT over every row, and no task that nobody submitted."""

    title = _("task name")
    parameter_name = "task_name"

    def lookups(self, request, model_admin):
        from ..keyed_task.task import KeyedSerialTask

        _import_task_modules()
        registered = [name for name, task in current_app.tasks.items() if isinstance(task, KeyedSerialTask)]
        names = {name for name in registered if model_admin.model.objects.filter(task_name=name).exists()}
        chosen = self.value()
        if chosen:
            names.add(chosen)  # a task no longer registered still has its records
        return [(name, name) for name in sorted(names)]

    def queryset(self, request, queryset):
        if self.value():
            return queryset.filter(task_name=self.value())
        return queryset


@functools.cache
def _import_task_modules() -> None:
    """Import the project's task modules as a worker does; a web process has not otherwise."""
    current_app.loader.import_default_modules()


#: A task id's start is searched from this many characters: 4 hex digits narrow a million random ids
#: to about 15 rows, where fewer would add tasks picked by chance to a key's or a name's rows.
TASK_ID_PREFIX_MIN = 4
#: A search matching at most this many rows pages over their ids, read from its indexes; one matching
#: more walks the list's own order (-id), where its rows are dense enough to fill a page soon.
FEW_MATCHES = 2000
#: A term's separators are read only as the keys that exist spell them, and at most this many ways.
KEY_READINGS_MAX = 32
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
        """The term with each separator read as any separator, where a key begins so: one query per
        separator typed. Each reading is a whole key, or the start of one up to a separator."""
        readings = [""]
        for char in self.term:
            if char in KEY_SEPARATORS:
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
            cursor.execute(
                "SELECT " + ", ".join(f"EXISTS({sql})" for sql, _ in probes),
                [param for _, params in probes for param in params],
            )
            found = cursor.fetchone()
        return [lookup for lookup, exists in zip(lookups, found, strict=True) if exists]

    def _task_names(self) -> list[str]:
        """Every task name that has records, in one query that seeks each in the task name index
        (a loose index scan; DISTINCT would read the whole index)."""
        meta, quote = self.tasks.model._meta, self.db.ops.quote_name
        table, name = quote(meta.db_table), quote(meta.get_field("task_name").column)
        sql = (
            f"WITH RECURSIVE names(name) AS (SELECT MIN({name}) FROM {table} UNION ALL"
            f" SELECT (SELECT MIN({name}) FROM {table} WHERE {name} > names.name) FROM names"
            " WHERE names.name IS NOT NULL) SELECT name FROM names WHERE name IS NOT NULL LIMIT %s"
        )
        with self.db.cursor() as cursor:
            cursor.execute(sql, [TASK_NAMES_MAX])
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


def _unindexed(field: str) -> Func:
    """The column as an expression no index matches, so the database walks ``-id`` and tests it."""
    return Func(F(field), template="(%(expressions)s || '')", output_field=CharField())


def _take(parts: list[QuerySet], bound: Q, limit: int, order: str) -> list:
    """Up to ``limit`` rows of ``parts`` in turn, each in ``order``; of the first, only those within ``bound``."""
    rows: list = []
    for at, part in enumerate(parts):
        rows += part.filter(bound if at == 0 else Q()).order_by(order)[: limit - len(rows)]
        if len(rows) >= limit:
            break
    return rows


def open_only_match(request, response):
    """The page of the one task a search from the search box found, instead of a list of it. The task
    page's "Close" leads back to the list of that search (Django's preserved filters), which opens no page."""
    cl = (getattr(response, "context_data", None) or {}).get("cl")
    if not isinstance(cl, CursorChangeList) or cl.only_match is None:
        return response
    task = cl.only_match
    messages.info(request, gettext("The only task that “%(term)s” finds.") % {"term": cl.query.strip()})
    back = urlencode({"_changelist_filters": cl.get_query_string()[1:]})
    return HttpResponseRedirect(f"{cl.url_for_result(task)}?{back}")


def read_cursor(query) -> tuple[int | None, int | None, bool]:
    """``(cursor, before, bad)`` from a query string; a bad value reads as no cursor at all."""
    given = [name for name in CURSOR_PARAMS if name in query]
    if not given:
        return None, None, False
    if len(given) > 1:
        return None, None, True
    try:
        value = int(query[given[0]])
    except ValueError:
        return None, None, True
    if not 0 <= value <= _MAX_ID:
        return None, None, True
    return (value, None, False) if given[0] == CURSOR_VAR else (None, value, False)


class CursorChangeList(ChangeList):
    """Keyset pagination over ``-id``: a page is one indexed SELECT of ``list_per_page + 1`` rows.

    The search box takes what ``TaskSearch`` says (the admin's ``search_fields`` only need to be
    non-empty for the box to show; see ``get_queryset``). A search that matches keys and other
    things too lists the keys' rows first: the page reads ``parts`` in turn, each by ``-id``, and a
    cursor's part is the one its row is in.

    Nothing is counted: Django's change list runs ``COUNT(*)`` over the filtered
    rows (and once more over all of them), which reads the whole table or index
    at millions of rows. Here the extra row tells whether an older page exists.
    Every filter of the list has an index ending in ``-id``, so the database
    walks the index from the cursor and stops after one page.
    """

    def __init__(self, request, *args, **kwargs):
        self.cursor, self.before, bad = read_cursor(request.GET)
        if bad:
            messages.warning(request, gettext("Ignored a bad page cursor; showing the newest tasks."))
        self.from_search_box = SEARCH_BOX_VAR in request.GET
        #: What a page reads in turn (``get_queryset`` sets it): a search's key rows, then its others.
        self.parts: list[QuerySet] = []
        #: The one task a search from the search box found (``open_only_match`` opens its page).
        self.only_match = None
        super().__init__(request, *args, **kwargs)
        # Sorting by another column would break the keyset order; so would facet counts the speed.
        self.sortable_by = ()
        self.add_facets = False
        self.is_facets_optional = False

    # Django drops its own page parameter from these two; the cursor is dropped the same way, so the
    # admin does not take it for a field lookup and the filter links start again at the newest row.
    @property
    def params(self) -> dict:
        return self._params

    @params.setter
    def params(self, value: dict) -> None:
        self._params = {k: v for k, v in value.items() if k not in _DROPPED}

    @property
    def filter_params(self) -> dict:
        return self._filter_params

    @filter_params.setter
    def filter_params(self, value: dict) -> None:
        self._filter_params = {k: v for k, v in value.items() if k not in _DROPPED}

    def get_filters_params(self, params=None):
        # The query string's lookups, which both the filters and ``lookup_allowed`` read: none with a
        # value no database can compare (``BadQueryValue``, answered 400).
        lookups = super().get_filters_params(params)
        check_lookups(lookups)
        return lookups

    def get_queryset(self, request, exclude_parameters=None):
        # Django's search ORs a case-insensitive match over the search fields: UPPER(key) = UPPER(%s)
        # on PostgreSQL, LIKE on SQLite; no index serves it, so at a million rows it reads the table.
        # Here TaskSearch turns the term into index lookups, and the page reads their rows one of three ways.
        search = TaskSearch(self.root_queryset, self.query) if self.query.strip() else None
        if self.params.get(SEARCH_VAR, "").strip() and not (search and search.lookups):
            self._forget_search()  # found nothing, or refused: the filters' links do not keep it
        query, self.query = self.query, ""
        try:
            # Django 4.2's get_queryset takes only the request.
            more = () if exclude_parameters is None else (exclude_parameters,)
            queryset = super().get_queryset(request, *more)
        finally:
            self.query = query
        if search is None:
            return queryset
        if not search.lookups:
            return queryset.none()
        keyed = [lookup for lookup in search.lookups if lookup.field == "key"]
        others = [lookup for lookup in search.lookups if lookup.field != "key"]
        if not (keyed and others):
            return self._matching(queryset, search, search.lookups)
        self.parts = [self._matching(queryset, search, keyed), self._matching(queryset, search, others, keyed)]
        return queryset.filter(search.condition())  # the pages read the parts; an action, its chosen rows of this

    def _matching(
        self, queryset: QuerySet, search: TaskSearch, lookups: Sequence[TermLookup], excluded: Sequence[TermLookup] = ()
    ) -> QuerySet:
        """The rows of ``queryset`` that ``lookups`` match and ``excluded`` do not, in page order."""
        condition = search.condition(lookups=lookups)
        if excluded:
            condition &= ~search.condition(lookups=excluded)
        if len(lookups) == 1 and lookups[0].whole:
            return queryset.filter(condition)  # one key or name: its (field, -id) index in page order
        # Up to FEW_MATCHES rows: every match's id, from the lookups' indexes, and the page is read by
        # those ids. More: the page walks -id and keeps the matches, which are then dense (unless they
        # are all old: then it reads the rows between, the one case that costs more than a page).
        if not any(lookup.unresolved for lookup in lookups):
            ids = list(self.root_queryset.filter(condition).order_by().values_list("pk", flat=True)[: FEW_MATCHES + 1])
            if len(ids) <= FEW_MATCHES:
                return queryset.filter(pk__in=ids)
        walked = {f"searched_{lookup.field}": _unindexed(lookup.field) for lookup in (*lookups, *excluded)}
        condition = search.condition("searched_{}", lookups)
        if excluded:
            condition &= ~search.condition("searched_{}", excluded)
        return queryset.alias(**walked).filter(condition)

    def _forget_search(self) -> None:
        self._params.pop(SEARCH_VAR, None)
        getattr(self, "_filter_params", {}).pop(SEARCH_VAR, None)  # Django 5.0 on

    def get_ordering(self, request, queryset):
        return ["-pk"]  # the keyset: every list index ends in -id

    def get_results(self, request):
        rows, self.has_newer, self.has_older = self._page(self.parts or [self.queryset], self.list_per_page)
        self.result_list = rows
        # What Django's templates read; equal counts hide the search box's "N results" (a count).
        self.result_count = self.full_result_count = len(rows)
        self.show_full_result_count = False
        self.show_admin_actions = True
        self.can_show_all = False
        self.multi_page = False  # keeps Django's numbered pagination (and its paginator) out
        self.paginator = None
        first_page = self.cursor is None and self.before is None and not self.has_older
        if self.from_search_box and self.query.strip() and first_page and len(rows) == 1:
            self.only_match = rows[0]

    @property
    def ranked(self) -> bool:
        """Whether the page lists a search's key rows first, then its others."""
        return len(self.parts) > 1

    def _page(self, parts: list[QuerySet], size: int) -> tuple[list, bool, bool]:
        """The rows of this page, ``parts`` in turn, each newest first, and whether newer and older rows exist."""
        if self.before is not None:
            at = self._part_of(parts, self.before)
            rows = _take(parts[at::-1], Q(pk__gt=self.before), size + 1, "pk")
            newer = len(rows) > size
            if newer or len(rows) == size:
                return rows[:size][::-1], newer, True
            self.before = None  # the newest rows make a short page: show a full first page instead
        at = 0 if self.cursor is None else self._part_of(parts, self.cursor)
        rows = _take(parts[at:], Q() if self.cursor is None else Q(pk__lt=self.cursor), size + 1, "-pk")
        return rows[:size], self.cursor is not None, len(rows) > size

    @staticmethod
    def _part_of(parts: list[QuerySet], pk: int) -> int:
        """The part whose rows hold ``pk``; the last if none does (a row deleted since its link was made)."""
        for at, part in enumerate(parts[:-1]):
            if part.filter(pk=pk).exists():
                return at
        return len(parts) - 1

    @property
    def newest_url(self) -> str:
        return self.get_query_string()

    @property
    def newer_url(self) -> str | None:
        if not self.has_newer:
            return None
        if self.result_list:
            first = self.result_list[0].pk
        else:
            assert self.cursor is not None  # newer rows and none here: the page began at a cursor
            first = max(self.cursor - 1, 0)
        return self.get_query_string({BEFORE_VAR: first})

    @property
    def older_url(self) -> str | None:
        if not self.has_older:
            return None
        return self.get_query_string({CURSOR_VAR: self.result_list[-1].pk})
