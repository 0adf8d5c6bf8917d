"""Who may see keyed tasks: one answer for the task list, the live keys page and the metrics."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_permission_codename

from ..records.models import KeyedTask


def may_view_tasks(user: Any) -> bool:
    """The task list's own test: Django's view permission on ``KeyedTask`` (``view_keyedtask``, or
    ``change_keyedtask``, which implies it, as ``ModelAdmin.has_view_permission`` reads them).

    The admin site asks an active staff user besides; a view outside the admin asks that itself.
    """
    opts = KeyedTask._meta
    return any(
        user.has_perm(f"{opts.app_label}.{get_permission_codename(action, opts)}") for action in ("view", "change")
    )
