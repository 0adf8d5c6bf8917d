"""Our admin pages' breadcrumbs, in the markup of the Django they run on: Django's own admin wrote them as
a ``div`` of links and ``›`` until 6.0, and as an ``ol`` list since; the admin's CSS styles only its own.
The template library ``keyed_queue_admin`` (``templatetags/`` holds its shim, where Django looks)."""

from __future__ import annotations

from functools import cache

from django import template
from django.template.loader import get_template

register = template.Library()


@cache
def breadcrumbs_are_a_list() -> bool:
    """Whether this Django's admin writes its breadcrumbs as ``<ol class="breadcrumbs">``, read from its base."""
    found = get_template("admin/base.html")
    source = getattr(getattr(found, "template", found), "source", "")  # Django's engine: its Template's source
    return '<ol class="breadcrumbs">' in source


@register.inclusion_tag("admin/keyed_queue/breadcrumbs.html")
def keyed_queue_breadcrumbs(*crumbs: str) -> dict:
    """``{% keyed_queue_breadcrumbs url1 text1 url2 text2 ... here %}``: links from the admin's home, then
    the page's own name."""
    *links, here = crumbs
    return {"links": list(zip(links[::2], links[1::2], strict=True)), "here": here, "as_list": breadcrumbs_are_a_list()}
