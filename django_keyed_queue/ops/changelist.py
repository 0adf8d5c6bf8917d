"""The keyed task list in the admin: filters and pagination that stay fast at millions of rows."""

from __future__ import annotations

import functools

from celery import current_app
from django.contrib import admin, messages
from django.contrib.admin.views.main import ORDER_VAR, ChangeList
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

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
        from ..worker.task import KeyedSerialTask

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

    The search box takes a task id or a key, matched exactly (the admin's ``search_fields`` only
    need to be non-empty for the box to show; see ``get_queryset``).

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

    def get_queryset(self, request, exclude_parameters=None):
        # Django's search ORs a case-insensitive match over the search fields: UPPER(key) = UPPER(%s)
        # on PostgreSQL, LIKE on SQLite; no index serves it, so at a million rows it reads the table.
        # Here the search text is one exact value: a task id (unique: at most one row), or else a
        # key, whose rows the (key, -id) index yields in page order. Keys are case-sensitive.
        query, self.query = self.query, ""
        try:
            # Django 4.2's get_queryset takes only the request.
            more = () if exclude_parameters is None else (exclude_parameters,)
            queryset = super().get_queryset(request, *more)
        finally:
            self.query = query
        term = query.strip()
        if not term:
            return queryset
        if self.root_queryset.filter(task_id=term).exists():
            return queryset.filter(task_id=term)
        if query != term and self.root_queryset.filter(key=query).exists():
            return queryset.filter(key=query)  # a key that itself begins or ends with spaces
        return queryset.filter(key=term)

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
