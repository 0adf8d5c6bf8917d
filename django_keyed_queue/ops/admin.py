"""The operator's admin: keyed tasks, their keys live, and the actions that repair them.

Every action goes through the recovery module (the reaper's own code), is
allowed by its own permission, and is written to the admin's log.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import redis
from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponseBadRequest, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.translation import gettext_lazy as _
from django.views.decorators.http import require_POST

from ..exceptions import ActionRefused
from ..records.models import IdempotencyKey, KeyedTask
from ..records.statuses import ACTIVE_STATUSES, Status
from . import recovery
from .changelist import CursorChangeList, TaskNameFilter
from .live import live_keys
from .timeline import key_timeline

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise

logger = logging.getLogger(__name__)

#: Query-string lookups the task list takes besides its own filters. Nothing else: a lookup on the
#: stored payloads (``message``, ``arguments``), which redaction keeps from the page, would let a
#: viewer confirm a secret by guessing it (``?message__contains=...``: one row or none).
ALLOWED_LOOKUPS = frozenset(
    f"{field}{suffix}" for field in ("key", "task_id", "task_name", "status") for suffix in ("", "__exact", "__in")
)

#: action -> the permission (codename on KeyedTask) it needs.
PERMISSIONS = {
    "cancel": "cancel_keyedtask",
    "retry": "retry_keyedtask",
    "release": "release_keyedtask",
    "pause": "pause_key",
    "resume": "resume_key",
}


#: The task page's fields, in order; times to the millisecond (see ``_at_ms``).
DETAIL_FIELDS = (
    *("task_id", "task_name", "key", "ticket", "status", "attempts", "worker", "arguments"),
    *("enqueued", "due", "dispatched", "started", "heartbeat", "finished", "waited", "ran", "error", "retried_as"),
)


def _at(value: datetime | None, *, ms: bool = False) -> str | None:
    """A moment in the current time zone to the second (or the millisecond): tasks of a key often
    run within one minute, which Django's default format would show as one time."""
    if value is None:
        return None
    local = timezone.localtime(value)
    return local.strftime("%Y-%m-%d %H:%M:%S") + (f".{local.microsecond // 1000:03d}" if ms else "")


def _took(span: timedelta | None) -> str | None:
    if span is None:
        return None
    seconds = span.total_seconds()
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, seconds = divmod(round(seconds), 60)
    return f"{minutes} min {seconds} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60} min"


def _at_ms(field: str, label: StrOrPromise) -> Callable:
    return admin.display(description=label)(lambda self, task: _at(getattr(task, field), ms=True))


@admin.register(KeyedTask)
class KeyedTaskAdmin(admin.ModelAdmin):
    list_display = ("short_id", "task_name", "key", "ticket", "status", "attempts", "enqueued_at_s", "waited", "ran")
    list_filter = ("status", TaskNameFilter)
    search_fields = ("=key", "=task_id")
    fields = DETAIL_FIELDS
    readonly_fields = DETAIL_FIELDS
    exclude = ("message",)

    @admin.display(description=_("task id"))
    def short_id(self, task: KeyedTask) -> str:
        """The first 8 characters (a task id is 36): the full id on hover and on the task's page."""
        return format_html('<span title="{}">{}</span>', task.task_id, task.task_id[:8])

    @admin.display(description=_("enqueued at"))
    def enqueued_at_s(self, task: KeyedTask) -> str | None:
        return _at(task.enqueued_at)

    @admin.display(description=_("waited"))
    def waited(self, task: KeyedTask) -> str | None:
        """From submission (or from its due time) until it started: the wait for its key."""
        return _took(task.waited)

    @admin.display(description=_("ran"))
    def ran(self, task: KeyedTask) -> str | None:
        return _took(task.ran)

    enqueued = _at_ms("enqueued_at", _("enqueued at"))
    due = _at_ms("due_at", _("due at"))
    dispatched = _at_ms("dispatched_at", _("dispatched at"))
    started = _at_ms("started_at", _("started at"))
    heartbeat = _at_ms("heartbeat_at", _("heartbeat at"))
    finished = _at_ms("finished_at", _("finished at"))
    show_full_result_count = False
    actions = ["cancel_tasks", "retry_tasks", "release_holders", "pause_keys", "resume_keys"]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False  # a record of what happened; the actions below are how an operator changes things

    def has_delete_permission(self, request, obj=None) -> bool:
        # An unfinished task's record is what rebuilding the gate after a loss of Redis reads.
        active = obj is not None and obj.status in ACTIVE_STATUSES
        return not active and super().has_delete_permission(request, obj)

    def get_actions(self, request, action_location=None):
        # Django 6.1 passes where the actions show (and warns if this does not take it); before, nothing.
        where = {} if action_location is None else {"action_location": action_location}
        actions = super().get_actions(request, **where)
        actions.pop("delete_selected", None)  # it would not spare unfinished tasks
        return actions

    def get_changelist(self, request, **kwargs):
        return CursorChangeList

    def lookup_allowed(self, lookup, value, request=None) -> bool:
        # Django answers an unlisted lookup with 400 (DisallowedModelAdminLookup).
        return lookup in ALLOWED_LOOKUPS

    # -- permissions: one per action (ModelAdmin looks up has_<name>_permission) --

    def _allowed(self, request: HttpRequest, action: str) -> bool:
        return request.user.has_perm(f"{KeyedTask._meta.app_label}.{PERMISSIONS[action]}")

    def has_cancel_permission(self, request) -> bool:
        return self._allowed(request, "cancel")

    def has_retry_permission(self, request) -> bool:
        return self._allowed(request, "retry")

    def has_release_permission(self, request) -> bool:
        return self._allowed(request, "release")

    def has_pause_permission(self, request) -> bool:
        return self._allowed(request, "pause")

    def has_resume_permission(self, request) -> bool:
        return self._allowed(request, "resume")

    # -- actions on the selected tasks --

    @admin.action(
        description=_("Cancel the selected waiting tasks, or failed ones that block their keys"), permissions=["cancel"]
    )
    def cancel_tasks(self, request, queryset):
        def cancel(task: KeyedTask, by: str) -> str | None:
            was = recovery.cancel(task.task_id, by=by)
            return "after it failed, blocking its key: the key moves on" if was.status == Status.FAILED else None

        self._each_task(request, queryset, "cancelled", cancel)

    @admin.action(
        description=_("Retry the selected failed tasks (at the end of their queues; one that blocks its key, first)"),
        permissions=["retry"],
    )
    def retry_tasks(self, request, queryset):
        def retry(task: KeyedTask, by: str) -> str:
            new_id = recovery.retry(task.task_id, by=by)
            if new_id == task.task_id:
                return "first on its key: it runs again before the key's others"
            retried = KeyedTask.objects.filter(task_id=new_id).latest("id")
            self.log_change(request, retried, f"Retry of {task.task_id} by {by}")
            return f"as {new_id}"

        self._each_task(request, queryset, "retried", retry)

    @admin.action(description=_("Release the selected running tasks' hold on their keys"), permissions=["release"])
    def release_holders(self, request, queryset):
        def release(task: KeyedTask, by: str) -> str:
            if task.ticket is None:
                raise ActionRefused(f"task {task.task_id} has no ticket: it holds no key")
            actions = [r.action for r in recovery.release(task.key, task.ticket, by=by) if r.ticket == task.ticket]
            return f"({', '.join(actions)})"

        self._each_task(request, queryset, "released", release)

    @admin.action(description=_("Pause the keys of the selected tasks"), permissions=["pause"])
    def pause_keys(self, request, queryset):
        for key in _keys(queryset):
            self._on_key(request, "pause", key)

    @admin.action(description=_("Resume the keys of the selected tasks"), permissions=["resume"])
    def resume_keys(self, request, queryset):
        for key in _keys(queryset):
            self._on_key(request, "resume", key)

    def _each_task(self, request, queryset, done: str, act: Callable[[KeyedTask, str], str | None]) -> None:
        by = _who(request)
        for task in queryset.defer("message", "arguments"):
            with self._refusals(request):
                detail = act(task, by)
                text = " ".join(filter(None, [f"{done.capitalize()} by {by}", detail]))
                self.log_change(request, task, text)
                self.message_user(request, f"{task.task_name}[{task.task_id}]: {text}", messages.SUCCESS)

    def _on_key(self, request, action: str, key: str, ticket: int | None = None, dispatch: int | None = None) -> None:
        by = _who(request)
        level = messages.SUCCESS
        with self._refusals(request):
            if action == "pause":
                recovery.pause(key, by=by)
                text = f"Key {key!r} paused by {by}"
            elif action == "resume":
                dispatched = recovery.resume(key, by=by)
                text = f"Key {key!r} resumed by {by}; {dispatched}"
                level = messages.WARNING if dispatched.failed or dispatched.refused else level
            else:
                assert ticket is not None
                recovery.release(key, ticket, dispatch=dispatch, by=by)
                text = f"Ticket {ticket} of key {key!r} released by {by}"
            _log_key(request, key, text)
            self.message_user(request, text, level)

    @contextmanager
    def _refusals(self, request) -> Iterator[None]:
        """An action that does not apply, or cannot reach Redis, is told to the operator, not raised."""
        try:
            yield
        except ActionRefused as refused:
            self.message_user(request, str(refused), messages.WARNING)
        except redis.RedisError as exc:
            self.message_user(request, f"the keyed queue's Redis did not answer: {exc}", messages.ERROR)

    # -- the task page, with its key's timeline --

    def change_view(self, request, object_id, form_url="", extra_context=None):
        task = self.get_object(request, object_id)
        extra: dict[str, object] = {"timeline": key_timeline(task)} if task is not None else {}
        extra["live_keys_url"] = reverse("admin:keyed_queue_keys")
        return super().change_view(request, object_id, form_url, {**extra, **(extra_context or {})})

    def changelist_view(self, request, extra_context=None):
        action = request.POST.get("action") if request.method == "POST" else None
        if action and action not in self.get_actions(request):
            # Django would answer 200 "No action selected": a forced POST is told it is not allowed.
            raise PermissionDenied(f"{request.user} may not run the action {action!r}")
        extra = {"live_keys_url": reverse("admin:keyed_queue_keys"), **(extra_context or {})}
        return super().changelist_view(request, extra)

    # -- the live keys page, reached from the task list --

    def get_urls(self):
        view = self.admin_site.admin_view
        return [
            path("keys/", view(self.keys_view), name="keyed_queue_keys"),
            path("keys/act/", view(require_POST(self.key_action_view)), name="keyed_queue_key_act"),
            *super().get_urls(),
        ]

    def keys_view(self, request):
        if not self.has_view_permission(request):
            raise PermissionDenied
        key = request.GET.get("key") or None
        try:
            states, more = live_keys(key=key)
        except redis.RedisError as exc:
            self.message_user(request, f"the keyed queue's Redis did not answer: {exc}", messages.ERROR)
            states, more = [], False
        context = {
            **self.admin_site.each_context(request),
            "title": _("Live keys"),
            "opts": self.model._meta,
            "states": states,
            "more": more,
            "key": key or "",
            "can": {action: self._allowed(request, action) for action in PERMISSIONS},
            "changelist_url": reverse("admin:keyed_queue_keyedtask_changelist"),
        }
        return TemplateResponse(request, "admin/keyed_queue/keys.html", context)

    def key_action_view(self, request):
        action, key, ticket, dispatch = (request.POST.get(name, "") for name in ("action", "key", "ticket", "dispatch"))
        if action not in ("pause", "resume", "release") or not key or (action == "release" and not _number(ticket)):
            return HttpResponseBadRequest("an action (pause, resume, release), a key and, to release, a ticket")
        if dispatch and not _number(dispatch):
            return HttpResponseBadRequest("a dispatch is a number")
        if not self._allowed(request, action):
            raise PermissionDenied(f"{request.user} may not {action} keys")
        release = (int(ticket), int(dispatch) if dispatch else None) if action == "release" else (None, None)
        self._on_key(request, action, key, *release)
        return HttpResponseRedirect(reverse("admin:keyed_queue_keys"))


@admin.register(IdempotencyKey)
class IdempotencyKeyAdmin(admin.ModelAdmin):
    """Which task a duplicate submission resolves to. The fingerprint and the arguments' digest are
    not shown: small arguments (an amount) could be guessed from them offline."""

    list_display = ("task_name", "task_id", "created_at", "expires_at")
    search_fields = ("=task_id",)
    fields = readonly_fields = ("task_name", "task_id", "created_at", "expires_at")
    show_full_result_count = False

    def lookup_allowed(self, lookup, value, request=None) -> bool:
        # No filter: Django answers any lookup in the query string with 400 (DisallowedModelAdminLookup).
        return False

    def has_add_permission(self, request) -> bool:
        return False


def _number(text: str) -> bool:
    """A whole number a BIGINT holds: ASCII digits only ("²".isdigit() is True, and int("²") raises)."""
    return text.isascii() and text.isdigit() and len(text) <= 18


def _keys(queryset) -> list[str]:
    return sorted(set(queryset.values_list("key", flat=True)))


def _who(request: HttpRequest) -> str:
    return request.user.get_username() or "an operator"


def _log_key(request: HttpRequest, key: str, text: str) -> None:
    """An action on a key, not on one task: logged against the keyed task model, with the key."""
    assert request.user.is_authenticated  # the admin's views let only staff in
    LogEntry.objects.create(
        user_id=request.user.pk,
        content_type=ContentType.objects.get_for_model(KeyedTask),
        object_id=None,
        object_repr=f"key {key}"[:200],
        action_flag=CHANGE,
        change_message=text,
    )
    logger.info("%s", text)
