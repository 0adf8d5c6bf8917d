"""What the operator's pages take from a query string to filter rows by: text a database can compare, lists bounded.

PostgreSQL refuses a NUL in text even to compare it (``DataError``, which a page would answer 500),
where SQLite finds no row. So a page refuses such a value on every database, with a 400 naming the
parameter, by the submissions' own check (``unstorable``). Over-long or odd text is taken: it finds
nothing, as on either database. The search box (``q``) is not checked here: Django's search form
refuses a NUL itself and shows the whole list.
"""

from __future__ import annotations

from django.core.exceptions import SuspiciousOperation
from django.http import HttpResponseBadRequest

from ...records.columns import shown, unstorable

#: The most values one ``__in`` filter takes (``?key__in=a,b,...``): as many as Django takes fields in
#: a query string; a database refuses a query with more parameters than its build allows (SQLite's
#: is 32,766 by default), which a page would answer 500.
MAX_LISTED_VALUES = 1000


class BadQueryValue(SuspiciousOperation):
    """A value of the query string a page does not filter by. The page answers it with ``bad_request``;
    raised past the page, Django's handler answers a ``SuspiciousOperation`` 400 too."""


def bad_query_value(name: str, value: str) -> str | None:
    """Why a page does not filter by ``name=value`` (naming both, the value cut short); None if it does."""
    problem = unstorable(value)
    if problem is None and name.endswith("__in") and value.count(",") >= MAX_LISTED_VALUES:
        problem = f"lists {value.count(',') + 1} values, over the maximum of {MAX_LISTED_VALUES}"
    return f"{name}={shown(value)} {problem}" if problem else None


def check_lookups(lookups: dict) -> None:
    """Raise ``BadQueryValue`` for the first bad value of a change list's lookups (a list of values
    each since Django 5.0, one value before)."""
    for name, values in lookups.items():
        for value in values if isinstance(values, list) else [values]:
            problem = bad_query_value(name, value)
            if problem:
                raise BadQueryValue(problem)


def bad_request(problem: str | BadQueryValue) -> HttpResponseBadRequest:
    """400, saying what was refused, as plain text (the value is the request's own: never HTML)."""
    return HttpResponseBadRequest(f"Bad query string: {problem}.\n", content_type="text/plain; charset=utf-8")


def whole_number(text: str) -> bool:
    """A whole number a BIGINT holds: ASCII digits only ("²".isdigit() is True, and int("²") raises)."""
    return text.isascii() and text.isdigit() and len(text) <= 18
