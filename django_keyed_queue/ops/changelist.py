"""The keyed task list in the admin: filters and pagination that stay fast at millions of rows."""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass

from celery import current_app
from django.contrib import admin, messages
from django.contrib.admin.views.main import ORDER_VAR, ChangeList
from django.db import connections
from django.db.models import CharField, F, Func, Q, QuerySet
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from ..gate import MAX_KEY_LENGTH
from ..records.columns import TASK_ID_MAX_LENGTH, TASK_NAME_MAX_LENGTH
from .query_string import check_lookups

#: ``?cursor=<id>``: the page of rows older than that id (the "Older" link).
CURSOR_VAR = "cursor"
#: ``?before=<id>``: the page of rows just newer than that id (the "Newer" link).
BEFORE_VAR = "before"
CURSOR_PARAMS = (CURSOR_VAR, BEFORE_VAR)
#: Dropped from the query like Django drops its page number: sorting is always by ``-id``, and
#: facet counts are never shown (Django 4.2, which has no facets, would take ``_facets`` for a lookup).
_DROPPED = (*CURSOR_PARAMS, ORDER_VAR, "_facets")
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


#: The characters that part a key's words. In a search each stands for any of them, one for one:
#: "account 6" finds account:6 and account/6. Not % or \: a search takes them as they are.
KEY_SEPARATORS = " :/-_.|#,;=+@"
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


@dataclass(frozen=True)
class TermLookup:
    """One thing a search matches: a field's whole value, or its start (``prefix``)."""

    field: str
    value: str
    prefix: bool = False


class TaskSearch:
    """What the search box finds for one term: the rows of every kind it matches (a union).

    - a task id, whole or its first ``TASK_ID_PREFIX_MIN`` or more characters;
    - a key, whole or its first words up to a separator, where each separator in the term stands
      for any of ``KEY_SEPARATORS`` ("account" and "account:" find account:6, "account 6" finds
      account:6 but not account:60); the text as typed, spaces and all, also matches a whole key;
    - a task name, whole or its last dotted parts ("send_invoice" finds shop.tasks.send_invoice).

    Case-sensitive, as keys are in the gate. ``lookups`` keeps only those some row matches, found
    by index seeks. Each is an equality or a prefix, read as one range of an index: on SQLite
    ``>= 'ab' AND < 'ac'`` (its LIKE ignores case, and no index serves it); elsewhere LIKE 'ab%',
    escaped, which PostgreSQL reads from a ``varchar_pattern_ops`` index.
    """

    def __init__(self, tasks: QuerySet, typed: str) -> None:
        self.tasks = tasks.order_by()  # lookups of a set: no ORDER BY for the database to honour
        self.db = connections[tasks.db]
        self.typed = typed
        self.term = typed.strip()
        # No record holds NUL, and PostgreSQL takes none even to compare (Django's search form refuses it first).
        self.lookups: list[TermLookup] = self._read() if self.term and "\x00" not in typed else []

    def condition(self, column: str = "{}") -> Q:
        """What a matching row satisfies (no lookup: nothing); ``column`` names each field's column."""
        return functools.reduce(operator.or_, (self._q(lookup, column) for lookup in self.lookups), Q(pk__in=[]))

    def _read(self) -> list[TermLookup]:
        candidates = []
        if len(self.term) <= TASK_ID_MAX_LENGTH:
            candidates.append(TermLookup("task_id", self.term, prefix=len(self.term) >= TASK_ID_PREFIX_MIN))
        if self.typed != self.term and len(self.typed) <= MAX_KEY_LENGTH:
            candidates.append(TermLookup("key", self.typed))  # a key that itself begins or ends with spaces
        if len(self.term) <= MAX_KEY_LENGTH:
            candidates += self._key_readings()
        found = self._present(candidates)
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
    non-empty for the box to show; see ``get_queryset``).

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
        query, self.query = self.query, ""
        try:
            # Django 4.2's get_queryset takes only the request.
            more = () if exclude_parameters is None else (exclude_parameters,)
            queryset = super().get_queryset(request, *more)
        finally:
            self.query = query
        if not query.strip():
            return queryset
        search = TaskSearch(self.root_queryset, query)
        if not search.lookups:
            return queryset.none()
        if len(search.lookups) == 1 and not search.lookups[0].prefix:
            return queryset.filter(search.condition())  # one key or name: its (field, -id) index in page order
        # Up to FEW_MATCHES rows: every match's id, from the lookups' indexes, and the page is read by
        # those ids. More: the page walks -id and keeps the matches, which are then dense (unless they
        # are all old: then it reads the rows between, the one case that costs more than a page).
        matching = self.root_queryset.filter(search.condition()).order_by().values_list("pk", flat=True)
        ids = list(matching[: FEW_MATCHES + 1])
        if len(ids) <= FEW_MATCHES:
            return queryset.filter(pk__in=ids)
        walked = {f"searched_{lookup.field}": _unindexed(lookup.field) for lookup in search.lookups}
        return queryset.alias(**walked).filter(search.condition("searched_{}"))

    def get_ordering(self, request, queryset):
        return ["-pk"]  # the keyset: every list index ends in -id

    def get_results(self, request):
        rows, self.has_newer, self.has_older = self._page(self.queryset, self.list_per_page)
        self.result_list = rows
        # What Django's templates read; equal counts hide the search box's "N results" (a count).
        self.result_count = self.full_result_count = len(rows)
        self.show_full_result_count = False
        self.show_admin_actions = True
        self.can_show_all = False
        self.multi_page = False  # keeps Django's numbered pagination (and its paginator) out
        self.paginator = None

    def _page(self, queryset, size: int) -> tuple[list, bool, bool]:
        """The rows of this page, newest first, and whether newer and older rows exist."""
        if self.before is not None:
            rows = list(queryset.filter(pk__gt=self.before).order_by("pk")[: size + 1])
            newer = len(rows) > size
            if newer or len(rows) == size:
                return rows[:size][::-1], newer, True
            self.before = None  # the newest rows make a short page: show a full first page instead
        page = queryset if self.cursor is None else queryset.filter(pk__lt=self.cursor)
        rows = list(page[: size + 1])
        return rows[:size], self.cursor is not None, len(rows) > size

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
