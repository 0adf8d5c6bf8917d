"""Who may see keyed tasks (one answer for the task list, the live keys page and the metrics), the permission
each operator's action needs, and who acts."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_permission_codename
from django.http import HttpRequest

from ...records.models import KeyedTask


def may_view_tasks(user: Any) -> bool:
    """The task list's own test: Django's view permission on ``KeyedTask`` (``view_keyedtask``, or
    ``change_keyedtask``, which implies it, as ``ModelAdmin.has_view_permission`` reads them).

    The admin site asks an active staff user besides; a view outside the admin asks that itself.
    """
    opts = KeyedTask._meta
    return any(
        user.has_perm(f"{opts.app_label}.{get_permission_codename(action, opts)}") for action in ("view", "change")
    )


#: action -> the permission (codename on KeyedTask) it needs.
PERMISSIONS = {
    "cancel": "cancel_keyedtask",
    "retry": "retry_keyedtask",
    "release": "release_keyedtask",
    "pause": "pause_key",
    "resume": "resume_key",
    "limit": "change_key_limits",
    "stop": "stop_keyedtask",
    "run_now": "run_now_keyedtask",
}


def who_acts(request: HttpRequest) -> str:
    """Who acts, as the admin's log, the task's record and the audit log say: the user's name."""
    return request.user.get_username() or "an operator"
