"""The keyed task list in the admin: filters and pagination that stay fast at millions of rows."""

from __future__ import annotations

from collections.abc import Sequence

from django.contrib import admin, messages
from django.contrib.admin.views.main import ORDER_VAR, SEARCH_VAR, ChangeList
from django.db.models import CharField, F, Func, Q, QuerySet
from django.http import HttpResponseRedirect
from django.utils.http import urlencode
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from .query_string import check_lookups
from .search import TaskSearch, TermLookup

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


#: The most task names the filter offers: found one query each, through the (task_name, -id) index.
TASK_NAMES_LISTED = 200


class TaskNameFilter(admin.SimpleListFilter):
    """The task names the records have (a task no longer registered too: its records stay), each found
    through the (task_name, -id) index by a skip scan: one seek a name, not a DISTINCT over every row."""

    title = _("task name")
    parameter_name = "task_name"

    def lookups(self, request, model_admin):
        names = set(recorded_task_names(model_admin.model.objects.all()))
        chosen = self.value()
        if chosen:
            names.add(chosen)  # a task no longer registered still has its records
        return [(name, name) for name in sorted(names)]

    def queryset(self, request, queryset):
        if self.value():
            return queryset.filter(task_name=self.value())
        return queryset


def recorded_task_names(rows: QuerySet, limit: int = TASK_NAMES_LISTED) -> list[str]:
    """The distinct task names of ``rows``, in order, at most ``limit``: each the first name after the last,
    one index seek."""
    names: list[str] = []
    after = None
    while len(names) < limit:
        later = rows if after is None else rows.filter(task_name__gt=after)
        after = later.order_by("task_name").values_list("task_name", flat=True).first()
        if after is None:
            break
        names.append(after)
    return names


#: A search matching at most this many rows pages over their ids, read from its indexes; one matching
#: more walks the list's own order (-id), where its rows are dense enough to fill a page soon.
FEW_MATCHES = 2000


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
