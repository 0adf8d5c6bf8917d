"""The operator's admin: keyed tasks, their keys live, and the actions that repair them.

Every action goes through the recovery module (the reaper's own code), is
allowed by its own permission, and is written to the admin's log.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING
from urllib.parse import quote

import redis
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.views.main import ChangeList
from django.db.models import Q
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, HttpResponseRedirect
from django.template.defaultfilters import pluralize
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _
from django.views.decorators.http import require_POST

from ...exceptions import ActionRefused
from ...process.state import console_gate
from ...records import idempotency, submissions
from ...records.models import IdempotencyKey, KeyedTask, LiveKey
from ...records.statuses import ACTIVE_STATUSES, Status
from ..actions import task_actions
from ..actions.lookup import registered_task
from ..display import at, epoch_ms, took
from .admin_keys import LiveKeysPages
from .changelist import CursorChangeList, TaskNameFilter, open_only_match
from .explain import explain_row
from .permissions import PERMISSIONS, may_view_tasks, who_acts
from .query_string import BadQueryValue, bad_request, whole_number
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

#: The task page's fields, in order.
DETAIL_FIELDS = (
    *("task_id", "task_name", "key", "pool", "ticket", "status", "attempts", "worker", "arguments"),
    *("enqueued", "due", "dispatched", "started", "heartbeat", "finished", "waited", "ran", "error", "notes"),
    *("retried_as_link", "retry_of_link", "superseded_by_link", "idempotency"),
)

#: What a page shows for a time or a span that has none yet.
NOTHING = "—"

#: A span that still grows, which the page's script ticks (``since_script.html``).
TICKING = '<span class="kq-since" data-since="{}">{}</span>'
#: A short value the list's narrow columns never break ("12 min 3 s"; a date; a time of day; see its CSS).
UNBROKEN = '<span class="kq-unbroken">{}</span>'


def _at(field: str, label: StrOrPromise) -> Callable:
    return admin.display(description=label)(lambda self, task: at(getattr(task, field)) or NOTHING)


def _task_link(task_id: str) -> str:
    """A link to the page of the latest record of ``task_id`` (its id alone if it has none)."""
    row = KeyedTask.objects.filter(task_id=task_id).order_by("-id").only("pk").first()
    if row is None:
        return task_id
    return format_html('<a href="{}">{}</a>', reverse("admin:keyed_queue_keyedtask_change", args=[row.pk]), task_id)


class _PagesOfOurs(admin.ModelAdmin):
    """What every admin of ours does alike."""

    def get_object(self, request, object_id, from_field=None):
        # Django reads ``?_to_field=`` (empty) on a change or delete page as a field named "" (FieldDoesNotExist,
        # a 500): it names no field, so the primary key.
        return super().get_object(request, object_id, from_field or None)


@admin.register(KeyedTask)
class KeyedTaskAdmin(_PagesOfOurs):
    list_display = (
        "short_id",
        "task_name",
        "key",
        "ticket",
        "status_said",
        "attempts",
        "enqueued_at_s",
        "waited",
        "ran",
    )
    list_filter = ("status", TaskNameFilter)
    search_fields = ("=key", "=task_id")
    search_help_text = _(
        "A task id or its first 4+ characters; a key or its first words, any separator for another (“account 6” "
        "finds account:6, “account” every account:… key); one word of a key (“1001” finds ledger:1001); a task name "
        "or its last part (send_invoice). Case-sensitive. A search that finds one task opens it."
    )
    fields = DETAIL_FIELDS
    readonly_fields = DETAIL_FIELDS
    exclude = ("message",)

    def get_object(self, request, object_id, from_field=None):
        """The task, its run's end written first where the gate keeps one (its page and its actions)."""
        task = super().get_object(request, object_id, from_field)
        return task if task is None else submissions.with_kept_end(console_gate, task)

    @admin.display(description=_("task id"))
    def short_id(self, task: KeyedTask) -> str:
        """The first 8 characters (a task id is 36): the full id on hover and on the task's page."""
        return format_html('<span title="{}">{}</span>', task.task_id, task.task_id[:8])

    @admin.display(description=_("status"))
    def status_said(self, task: KeyedTask) -> str:
        """Its status, marked where another task took its place: an operator's retry, a newer submission."""
        said = task.get_status_display()
        if task.retried_as:
            return format_html('{}, <a href="?q={}" title="{}">retried</a>', said, task.retried_as, task.retried_as)
        return f"{said}, superseded" if task.superseded_by else said

    @admin.display(description=_("enqueued at"))
    def enqueued_at_s(self, task: KeyedTask) -> str | None:
        """Its moment, as every page of ours writes one; in the list it may wrap between its date and its time."""
        day, _, time_of_day = (at(task.enqueued_at) or "").partition(" ")
        return format_html(UNBROKEN + " " + UNBROKEN, day, time_of_day)

    @admin.display(description=_("waited"))
    def waited(self, task: KeyedTask) -> str | None:
        """From submission (or from its due time) until it started: the wait for its key; ticking while it waits."""
        if task.started_at is None and task.status in (Status.WAITING, Status.DISPATCHED):
            waits_since = task.due_at or task.enqueued_at
            if waits_since <= timezone.now():
                return format_html("waiting for " + TICKING, epoch_ms(waits_since), took(timezone.now() - waits_since))
        return format_html(UNBROKEN, took(task.waited) or NOTHING)

    @admin.display(description=_("ran"))
    def ran(self, task: KeyedTask) -> str | None:
        if task.started_at is not None and task.status in (Status.RUNNING, Status.RETRYING):
            return format_html(
                "running for " + TICKING, epoch_ms(task.started_at), took(timezone.now() - task.started_at)
            )
        return format_html(UNBROKEN, took(task.ran) or NOTHING)

    @admin.display(description=_("retried as"))
    def retried_as_link(self, task: KeyedTask) -> str:
        return _task_link(task.retried_as) if task.retried_as else NOTHING

    @admin.display(description=_("retry of"))
    def retry_of_link(self, task: KeyedTask) -> str:
        """The failed task an operator retried as this one."""
        return _task_link(task.retry_of) if task.retry_of else NOTHING

    @admin.display(description=_("superseded by"))
    def superseded_by_link(self, task: KeyedTask) -> str:
        """The task of a coalescing key whose submission replaced this one while it waited, and those that replaced
        it in turn: the last is the one that runs."""
        if not task.superseded_by:
            return NOTHING
        runs = idempotency.resolve(console_gate(), task.task_id, task.key)
        if runs == task.superseded_by:
            return _task_link(runs)
        return format_html("{}, itself replaced in turn: {} is the one that runs", _task_link(task.superseded_by),
                           _task_link(runs))  # fmt: skip

    @admin.display(description=_("pool"))
    def pool(self, task: KeyedTask) -> str:
        """The pool its task takes a slot of (``pool=``), as this project registers the task."""
        return getattr(registered_task(None, task.task_name), "serial_pool", None) or NOTHING

    @admin.display(description=_("idempotency"))
    def idempotency(self, task: KeyedTask) -> str:
        """The idempotency keys that answer with this task, and the duplicates each answered."""
        claims = IdempotencyKey.objects.filter(task_id=task.task_id).order_by("created_at")
        return _joined([_claim_said(claim) for claim in claims]) or NOTHING

    enqueued = _at("enqueued_at", _("enqueued at"))
    due = _at("due_at", _("due at"))
    dispatched = _at("dispatched_at", _("dispatched at"))
    started = _at("started_at", _("started at"))
    heartbeat = _at("heartbeat_at", _("heartbeat at"))
    finished = _at("finished_at", _("finished at"))
    show_full_result_count = False
    actions = ["cancel_tasks", "retry_tasks", "release_holders", "pause_keys", "resume_keys"]

    def has_view_permission(self, request, obj=None) -> bool:
        return may_view_tasks(request.user)  # the live keys page and the metrics ask the same

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

    # -- permissions: one per action (ModelAdmin looks up has_<name>_permission), and refusals; the live keys
    # pages take them too --

    def allowed(self, request: HttpRequest, action: str) -> bool:
        return request.user.has_perm(f"{KeyedTask._meta.app_label}.{PERMISSIONS[action]}")

    @contextmanager
    def refusals(self, request) -> Iterator[None]:
        """An action that does not apply, or cannot reach Redis, is told to the operator, not raised."""
        try:
            yield
        except ActionRefused as refused:
            self.message_user(request, str(refused), messages.WARNING)
        except redis.RedisError as exc:
            self.message_user(request, f"the keyed queue's Redis did not answer: {exc}", messages.ERROR)

    def refused(self, request, what: str) -> HttpResponse:
        """403, saying what the user may not do (Django's own 403 page says nothing)."""
        may_view = self.has_view_permission(request)
        text = f"You may {'view keyed tasks but not ' if may_view else 'not '}{what}."
        context = {**self.admin_site.each_context(request), "title": _("Not allowed"), "text": text}
        return TemplateResponse(request, "admin/keyed_queue/refused.html", context, status=403)

    def has_cancel_permission(self, request) -> bool:
        return self.allowed(request, "cancel")

    def has_retry_permission(self, request) -> bool:
        return self.allowed(request, "retry")

    def has_run_now_permission(self, request) -> bool:
        return self.allowed(request, "run_now")

    def has_stop_permission(self, request) -> bool:
        return self.allowed(request, "stop")

    def has_release_permission(self, request) -> bool:
        return self.allowed(request, "release")

    def has_pause_permission(self, request) -> bool:
        return self.allowed(request, "pause")

    def has_resume_permission(self, request) -> bool:
        return self.allowed(request, "resume")

    # -- actions on the selected tasks --

    @admin.action(
        description=_("Cancel the selected waiting tasks, or failed ones that block their keys"), permissions=["cancel"]
    )
    def cancel_tasks(self, request, queryset):
        return self._each_task(request, queryset, "cancel")

    @admin.action(
        description=_("Retry the selected failed tasks (at the end of their queues; one that blocks its key, first)"),
        permissions=["retry"],
    )
    def retry_tasks(self, request, queryset):
        return self._each_task(request, queryset, "retry")

    @admin.action(description=_("Release the selected running tasks' hold on their keys"), permissions=["release"])
    def release_holders(self, request, queryset):
        return self._each_task(request, queryset, "release")

    @admin.action(description=_("Pause the keys of the selected tasks"), permissions=["pause"])
    def pause_keys(self, request, queryset):
        return self._each_key(request, queryset, "pause")

    @admin.action(description=_("Resume the keys of the selected tasks"), permissions=["resume"])
    def resume_keys(self, request, queryset):
        return self._each_key(request, queryset, "resume")

    def _each_key(self, request, queryset, action: str):
        """A list action on the selected tasks' keys: first what it does to each key, then, confirmed, done."""
        keys = _keys(queryset)
        if request.POST.get("post") == "yes":
            for key in keys:
                LiveKeysPages(self).on_key(request, action, key)
            return None
        try:
            proposals = [task_actions.propose_for_key(action, key) for key in keys]
        except redis.RedisError as exc:
            self.message_user(request, f"the keyed queue's Redis did not answer: {exc}", messages.ERROR)
            return None
        selected = list(queryset.values_list("pk", "key"))
        items = [
            {"label": f"key {p.key}", "url": "", "key": p.key, "status": "", "proposal": p,
             "pks": [pk for pk, key in selected if key == p.key] if p.applies else []}
            for p in proposals
        ]  # fmt: skip
        return self._confirmation(request, action, items, what="keys")

    def _each_task(self, request, queryset, action: str):
        """A list action on the selected tasks: first a page saying what it will do to each, as Django's
        delete action shows what it deletes; confirmed, it is done to each and told in one message."""
        tasks = list(queryset.defer("message", "arguments").order_by("pk"))
        if request.POST.get("post") != "yes":
            return self._confirm_many(request, tasks, action)
        self._act_on_many(request, tasks, action)
        return None

    def _confirm_many(self, request, tasks: list[KeyedTask], action: str):
        try:
            proposals = [task_actions.propose(action, task, many=True) for task in tasks]
        except redis.RedisError as exc:
            self.message_user(request, f"the keyed queue's Redis did not answer: {exc}", messages.ERROR)
            return None
        items = [
            {"label": f"{p.task.task_name}[{p.task.task_id}]", "key": p.task.key, "status": p.task.status,
             "url": reverse("admin:keyed_queue_keyedtask_change", args=[p.task.pk]), "proposal": p,
             "pks": [p.task.pk] if p.applies else []}
            for p in proposals
        ]  # fmt: skip
        return self._confirmation(request, action, items, what="tasks")

    def _confirmation(self, request, action: str, items: list[dict], *, what: str):
        """The page a list action shows first: what it does to each of the selected ``what`` (tasks, or their
        keys), each by its own proposal; its form posts back the list's action on those it applies to."""
        verb = task_actions.VERBS[action]
        applies = sum(item["proposal"].applies for item in items)
        context = {
            **self.admin_site.each_context(request),
            "title": f"{verb} {applies} of the {len(items)} selected {what}?",
            "opts": self.model._meta,
            "items": items,
            "applies": applies,
            "verb": verb,
            "what": what,
            "list_action": request.POST.get("action", ""),  # the list's action, which the form posts back
            "action_checkbox_name": ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(request, "admin/keyed_queue/keyedtask/confirm_many.html", context)

    def _act_on_many(self, request, tasks: list[KeyedTask], action: str) -> None:
        """Do ``action`` to each task as its confirmation named it; one message says what was done and what
        was refused (a task that moved on since it was shown is refused, the others go on)."""
        by = who_acts(request)
        done, refused = [], []
        for task in tasks:
            seen = {
                name: int(value)
                for name in ("ticket", "dispatch")
                if whole_number(value := request.POST.get(f"seen-{task.pk}-{name}", ""))
            }
            try:
                text, runs = task_actions.perform(action, task, by, seen or None, many=True)
            except (ActionRefused, redis.RedisError) as exc:
                refused.append(format_html("<li>{}[{}]: {}</li>", task.task_name, task.task_id, str(exc)))
                continue
            said = self._log_done(request, task, text, runs)
            done.append(format_html("<li>{}[{}]: {}</li>", task.task_name, task.task_id, said))
        verb = task_actions.VERBS[action]
        parts = [format_html("{} done to {} of {} tasks.", verb, len(done), len(tasks))]
        if done:
            parts.append(format_html("<ul>{}</ul>", _joined(done)))
        if refused:
            parts.append(format_html("Refused for {}:<ul>{}</ul>", len(refused), _joined(refused)))
        self.message_user(request, _joined(parts), messages.WARNING if refused else messages.SUCCESS)

    def _act_on_task(
        self,
        request,
        task: KeyedTask,
        action: str,
        seen: dict[str, int] | None = None,
        picked: dict[str, str] | None = None,
    ) -> None:
        """Do ``action``, log it, and tell the operator what happened, with a link to the task that runs now."""
        by = who_acts(request)
        with self.refusals(request):
            text, runs = task_actions.perform(action, task, by, seen, picked)
            said = self._log_done(request, task, text, runs)
            self.message_user(request, format_html("{}[{}]: {}", task.task_name, task.task_id, said), messages.SUCCESS)

    def _log_done(self, request, task: KeyedTask, text: str, runs: str | None):
        """Write a done action to the admin's log; what to tell the operator, with a link to the task that
        runs now (a retry's)."""
        by = who_acts(request)
        if runs is None or runs == task.task_id:
            self.log_change(request, task, text)
            return format_html("{}", text)
        self.log_change(request, task, f"{text} {runs}")  # a new task: named in the log, linked in the message
        self.log_change(
            request, KeyedTask.objects.filter(task_id=runs).latest("id"), f"Retry of {task.task_id} by {by}"
        )
        return format_html("{} {}", text, _task_link(runs))

    # -- the task page, with its key's timeline --

    def change_view(self, request, object_id, form_url="", extra_context=None):
        task = self.get_object(request, object_id)
        extra: dict[str, object] = {
            "live_keys_url": reverse("admin:keyed_queue_keys"),
            "now_ms": epoch_ms(timezone.now()),
        }
        if task is not None:
            extra["timeline"] = key_timeline(task)
            try:
                explanation = explain_row(task)  # one read of the key: why it waits, and what may be done
            except redis.RedisError as exc:
                self.message_user(request, f"the keyed queue's Redis did not answer: {exc}", messages.ERROR)
            else:
                extra["explanation"] = explanation
                extra["task_actions"] = [
                    (action, task_actions.VERBS[action], reverse("admin:keyed_queue_task_act", args=[task.pk, action]))
                    for action in task_actions.available(task, explanation.own_slot)
                    if self.allowed(request, action)
                ]
        return super().change_view(request, object_id, form_url, {**extra, **(extra_context or {})})

    def changelist_view(self, request, extra_context=None):
        action = request.POST.get("action") if request.method == "POST" else None
        if action and action not in self.get_actions(request):
            # Django would answer 200 "No action selected": a forced POST is told it is not allowed.
            return self.refused(request, f"run the action {action!r}")
        extra = {"live_keys_url": reverse("admin:keyed_queue_keys"), **(extra_context or {})}
        if request.method == "GET":
            try:  # the latest submissions too: the workers write their rows only past the record delay
                submissions.write_page(console_gate())
            except redis.RedisError:
                logger.warning("keyed queue: the task list shows only written rows: Redis is out of reach")
        try:
            return open_only_match(request, super().changelist_view(request, extra))
        except BadQueryValue as bad:  # a filter's value no database can compare (the change list checks)
            return bad_request(bad)

    def task_action_view(self, request, object_id, action):
        """An action on one task: GET shows what it will do, POST does it (``task_actions``)."""
        task = self.get_object(request, object_id)
        if task is None or action not in task_actions.ACTIONS:
            return HttpResponseBadRequest("no such task or action")
        if not self.allowed(request, action):
            return self.refused(request, f"{action} them")
        page = reverse("admin:keyed_queue_keyedtask_change", args=[task.pk])
        # Where the operator came from (the live keys page, with its filter), to go back there after.
        back = request.POST.get("next") or request.GET.get("next") or ""
        if not back.startswith("/") or not url_has_allowed_host_and_scheme(back, allowed_hosts={request.get_host()}):
            back = ""  # a page of this site only, named from its root
        if request.method != "POST":
            try:
                proposal = task_actions.propose(action, task)
            except redis.RedisError as exc:
                self.message_user(request, f"the keyed queue's Redis did not answer: {exc}", messages.ERROR)
                return HttpResponseRedirect(page)
            context = {
                **self.admin_site.each_context(request),
                "title": f"{task_actions.VERBS[action]} {task.task_name}[{task.task_id}]?",
                "opts": self.model._meta,
                "original": task,
                "proposal": proposal,
                "verb": task_actions.VERBS[action],
                "task_url": page,
                "back": back or page,
                "instead_url": proposal.instead
                and self.allowed(request, proposal.instead)
                and reverse("admin:keyed_queue_task_act", args=[task.pk, proposal.instead]),
            }
            return TemplateResponse(request, "admin/keyed_queue/keyedtask/confirm_action.html", context)
        # What the operator confirmed: a release frees only the dispatch they were shown.
        seen = {
            name: int(request.POST[name]) for name in ("ticket", "dispatch") if whole_number(request.POST.get(name, ""))
        }
        picked = {"signal": request.POST["signal"]} if "signal" in request.POST else None
        self._act_on_task(request, task, action, seen, picked)
        return HttpResponseRedirect(back or page)

    # -- the pages' own URLs: the live keys page (``admin_keys``) and an action on one task --

    def get_urls(self):
        view, live = self.admin_site.admin_view, LiveKeysPages(self)
        return [
            path("keys/", view(live.keys_view), name="keyed_queue_keys"),
            path("keys/act/", view(require_POST(live.key_action_view)), name="keyed_queue_key_act"),
            path("<path:object_id>/act/<str:action>/", view(self.task_action_view), name="keyed_queue_task_act"),
            *super().get_urls(),
        ]


@admin.register(LiveKey)
class LiveKeyAdmin(_PagesOfOurs):
    """The live keys page's entry on the admin's home page: its list is that page."""

    def has_view_permission(self, request, obj=None) -> bool:
        return may_view_tasks(request.user)

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def changelist_view(self, request, extra_context=None):
        return HttpResponseRedirect(reverse("admin:keyed_queue_keys"))


class _CountedOnce(ChangeList):
    """Django's change list, which with ``show_full_result_count = False`` tells "1 result (Show all)" of a
    list nobody searched: unsearched, the rows it counted are all of them."""

    def get_results(self, request):
        super().get_results(request)
        if not self.query.strip():
            self.full_result_count = self.result_count


def _claim_said(claim: IdempotencyKey) -> SafeString:
    """An idempotency key on a task's page: its text (or that its arguments are the key), its expiry, and
    the duplicates it answered."""
    which = format_html("key <code>{}</code>", claim.key) if claim.key else format_html("{}", "its arguments")
    answered = (
        format_html("; answered {} duplicate{}, the last at {}", claim.duplicates, pluralize(claim.duplicates),
                    at(claim.last_duplicate_at) or NOTHING)
        if claim.duplicates else format_html("{}", "; no duplicate yet")
    )  # fmt: skip
    return format_html("<div>{} (until {}){}</div>", which, at(claim.expires_at), answered)


@admin.register(IdempotencyKey)
class IdempotencyKeyAdmin(_PagesOfOurs):
    """Which task a duplicate submission resolves to, and how many it answered. The fingerprint and the
    arguments' digest are not shown: small arguments (an amount) could be guessed from them offline."""

    list_display = ("key_said", "task_name", "task_found", "answered", "last_duplicate", "created", "expires")
    fields = readonly_fields = ("key_said", "task_name", "task_link", *list_display[3:])
    search_fields = ("=key", "=task_id")
    search_help_text = _("An idempotency key or a task id, whole. Case-sensitive.")
    show_full_result_count = False
    created = _at("created_at", _("created at"))
    expires = _at("expires_at", _("expires at"))
    last_duplicate = _at("last_duplicate_at", _("last duplicate at"))

    @admin.display(description=_("duplicates"), ordering="duplicates")
    def answered(self, claim: IdempotencyKey) -> int:
        """How many duplicate submissions it answered with its task (the column's name kept short)."""
        return claim.duplicates

    @admin.display(description=_("idempotency key"))
    def key_said(self, claim: IdempotencyKey) -> StrOrPromise:
        return claim.key or _("its arguments (not shown)")

    @admin.display(description=_("task id"))
    def task_link(self, claim: IdempotencyKey) -> str:
        return _task_link(claim.task_id)

    @admin.display(description=_("task id"))
    def task_found(self, claim: IdempotencyKey) -> str:
        """The task list's search for the task id, which opens its page: no query a row."""
        url = reverse("admin:keyed_queue_keyedtask_changelist")
        return format_html('<a href="{}?q={}">{}</a>', url, quote(claim.task_id, safe=""), claim.task_id)

    def get_changelist(self, request, **kwargs):
        return _CountedOnce

    def get_search_results(self, request, queryset, search_term):
        """The whole key or task id, as written: one lookup on an index each (Django's ``=`` is case-blind,
        which no plain index serves)."""
        term = search_term.strip()
        if not term:
            return queryset, False
        return queryset.filter(Q(key=term) | Q(task_id=term)), False

    def lookup_allowed(self, lookup, value, request=None) -> bool:
        # No filter: Django answers any lookup in the query string with 400 (DisallowedModelAdminLookup).
        return False

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False  # what a submission resolves to, written by the submission: its page is "View", with no Save


def _joined(parts: list[SafeString]) -> SafeString:
    """Parts of a page, each made safe by ``format_html``, one after the other."""
    return format_html_join("", "{}", ((part,) for part in parts))


def _keys(queryset) -> list[str]:
    return sorted(set(queryset.values_list("key", flat=True)))
