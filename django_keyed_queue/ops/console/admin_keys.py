"""The live keys page and its actions on a key (pause, resume, release, limit and rate): views the task
list's admin (``KeyedTaskAdmin``) holds and routes to."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import redis
from django.contrib import messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.http import urlencode
from django.utils.translation import gettext_lazy as _

from ...records.columns import TASK_ID_MAX_LENGTH, unstorable
from ...records.models import KeyedTask
from ..actions import limits, recovery
from ..display import epoch_ms
from . import unheld
from .live import live_keys
from .permissions import PERMISSIONS, who_acts
from .query_string import bad_query_value, bad_request, whole_number

if TYPE_CHECKING:
    from .admin import KeyedTaskAdmin

logger = logging.getLogger("django_keyed_queue.ops.console.admin")

#: How often the live keys page reloads itself while its "Refresh" toggle is on.
LIVE_REFRESH_SECONDS = 5


class LiveKeysPages:
    """The live keys page's views, which the task list's admin (``admin``) routes to: they take its
    permissions, its refusals and its messages."""

    def __init__(self, admin: KeyedTaskAdmin) -> None:
        self.admin = admin

    def keys_view(self, request):
        if not self.admin.has_view_permission(request):
            return self.admin.refused(request, "view keyed tasks")
        key = request.GET.get("key") or None
        problem = key and bad_query_value("key", key)
        if problem:
            return bad_request(problem)
        try:
            page = live_keys(search=key)
        except redis.RedisError as exc:
            self.admin.message_user(request, f"the keyed queue's Redis did not answer: {exc}", messages.ERROR)
            page = None
        context = {
            **self.admin.admin_site.each_context(request),
            "title": _("Live keys"),
            "opts": KeyedTask._meta,
            "page": page,
            "states": page.states if page else [],
            "key": key or "",
            "can": {action: self.admin.allowed(request, action) for action in PERMISSIONS},
            "changelist_url": reverse("admin:keyed_queue_keyedtask_changelist"),
            "now_ms": epoch_ms(timezone.now()),
            "refresh_seconds": LIVE_REFRESH_SECONDS,
            "rows_read": unheld.ROWS_READ,
        }
        return TemplateResponse(request, "admin/keyed_queue/keys.html", context)

    def key_action_view(self, request):
        action, key, ticket, dispatch = (request.POST.get(name, "") for name in ("action", "key", "ticket", "dispatch"))
        if action == "pool_limit":
            return self._pool_limit(request)
        if (
            action not in ("pause", "resume", "release", "limit")
            or not key
            or (action == "release" and not whole_number(ticket))
        ):
            return HttpResponseBadRequest("an action (pause, resume, release, limit), a key and, to release, a ticket")
        if dispatch and not whole_number(dispatch):
            return HttpResponseBadRequest("a dispatch is a number")
        task_id = request.POST.get("task_id", "")
        if problem := task_id and unstorable(task_id, TASK_ID_MAX_LENGTH):
            return HttpResponseBadRequest(f"a task id {problem}", content_type="text/plain; charset=utf-8")
        if not self.admin.allowed(request, action):
            return self.admin.refused(request, f"{action} keys")
        ticket_number, dispatch_number = (
            (int(ticket), int(dispatch) if dispatch else None) if action == "release" else (None, None)
        )
        self.on_key(request, action, key, ticket_number, dispatch_number, task_id)
        return _back_to_page(request)

    def _pool_limit(self, request):
        """A pool's limit and rate, as the pools table's form typed them; the same permission as a key's."""
        pool = request.POST.get("pool", "")
        if problem := bad_query_value("pool", pool) if pool else "a pool's name":
            return HttpResponseBadRequest(f"pool_limit needs {problem}", content_type="text/plain; charset=utf-8")
        if not self.admin.allowed(request, "limit"):
            return self.admin.refused(request, "limit keys or pools")
        by = who_acts(request)
        with self.admin.refusals(request):
            typed = {name: request.POST.get(name, "").strip() for name in ("limit", "rate")}
            text = f"Pool {pool!r}: {limits.set_typed(pool=pool, **typed, by=by) or 'nothing changed'}, set by {by}"
            _log_action(request, f"pool {pool}", text)
            self.admin.message_user(request, text, messages.SUCCESS)
        return _back_to_page(request)

    def on_key(
        self, request, action: str, key: str, ticket: int | None = None, dispatch: int | None = None, task_id: str = ""
    ) -> None:
        by = who_acts(request)
        level = messages.SUCCESS
        with self.admin.refusals(request):
            if action == "pause":
                if recovery.pause(key, by=by):
                    text = f"Key {key!r} paused by {by}"
                else:
                    text, level = f"Key {key!r} was paused already: nothing changed, by {by}", messages.INFO
            elif action == "resume":
                dispatched = recovery.resume(key, by=by)
                if dispatched is None:
                    text, level = f"Key {key!r} was not paused: nothing changed, by {by}", messages.INFO
                else:
                    text = f"Key {key!r} resumed by {by}; {dispatched}"
                    refused = dispatched.broker_refused or dispatched.message_refused
                    level = messages.WARNING if refused else level
            elif action == "limit":
                typed = {name: request.POST.get(name, "").strip() for name in ("limit", "rate")}
                text = f"Key {key!r}: {limits.set_typed(key=key, **typed, by=by) or 'nothing changed'}, set by {by}"
            else:
                assert ticket is not None
                recovery.release(key, ticket, dispatch=dispatch, task_id=task_id or None, by=by)
                whose = f" (task {task_id})" if task_id else ""
                text = f"Ticket {ticket}{whose} of key {key!r} released by {by}"
            _log_action(request, f"key {key}", text)
            self.admin.message_user(request, text, level)


def _back_to_page(request: HttpRequest) -> HttpResponse:
    """The live keys page again, with its own filter kept after the action."""
    shown = request.POST.get("shown_key", "")
    return HttpResponseRedirect(reverse("admin:keyed_queue_keys") + (f"?{urlencode({'key': shown})}" if shown else ""))


def _log_action(request: HttpRequest, on: str, text: str) -> None:
    """An action on a key or a pool (``on``: "key account:7", "pool payments"), not on one task: logged
    against the keyed task model, naming what it acted on."""
    assert request.user.is_authenticated  # the admin's views let only staff in
    LogEntry.objects.create(
        user_id=request.user.pk,
        content_type=ContentType.objects.get_for_model(KeyedTask),
        object_id=None,
        object_repr=on[:200],
        action_flag=CHANGE,
        change_message=text,
    )
    logger.info("%s", text)
