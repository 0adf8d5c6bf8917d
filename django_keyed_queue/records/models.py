"""The record of what happened to every keyed submission. Redis decides; these record."""

from __future__ import annotations

from datetime import timedelta

from django.db import models
from django.utils.translation import gettext_lazy as _

from ..gate import MAX_KEY_LENGTH
from .columns import IDEMPOTENCY_KEY_MAX_LENGTH, TASK_ID_MAX_LENGTH, TASK_NAME_MAX_LENGTH
from .manager import KeyedTaskManager
from .statuses import ACTIVE_STATUSES, Status


class KeyedTask(models.Model):
    #: Celery's task id. Not unique: Celery reuses an id on purpose (``replace``, a resent
    #: signature), and each submission, ``(task_id, key, ticket)``, has its own row. No index of its
    #: own: the unique constraint's begins with it (and PostgreSQL's prefix search has one, 0012).
    task_id = models.CharField(_("task id"), max_length=TASK_ID_MAX_LENGTH)
    task_name = models.CharField(_("task name"), max_length=TASK_NAME_MAX_LENGTH)
    key = models.CharField(_("key"), max_length=MAX_KEY_LENGTH)
    ticket = models.BigIntegerField(_("ticket"), null=True, blank=True)
    status = models.CharField(_("status"), max_length=16, choices=Status.choices, default=Status.WAITING)
    arguments = models.TextField(_("arguments"), blank=True)
    #: The task message as the gate stores it: what rebuilding the gate after a loss of Redis needs.
    message = models.TextField(_("message"), blank=True, editable=False)
    attempts = models.PositiveIntegerField(_("attempts"), default=0)
    worker = models.CharField(_("worker"), max_length=255, blank=True)
    enqueued_at = models.DateTimeField(_("enqueued at"))
    #: When a task sent with a countdown or eta joins its key's queue.
    due_at = models.DateTimeField(_("due at"), null=True, blank=True)
    dispatched_at = models.DateTimeField(_("dispatched at"), null=True, blank=True)
    started_at = models.DateTimeField(_("started at"), null=True, blank=True)
    #: Its first attempt's start (``started_at`` is its last's): the end of its wait for its key.
    first_started_at = models.DateTimeField(_("first started at"), null=True, blank=True)
    heartbeat_at = models.DateTimeField(_("heartbeat at"), null=True, blank=True)
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)
    error = models.TextField(_("error"), blank=True)
    #: What happened beside its status and error, a line each, appended: an attempt released while it
    #: may still run, and when such an attempt ended, beside the one after it.
    notes = models.TextField(_("notes"), blank=True, default="")
    #: The task an operator's retry of this failed task submitted (set in the step that submits it).
    retried_as = models.CharField(_("retried as"), max_length=TASK_ID_MAX_LENGTH, blank=True, default="")
    #: The failed task an operator's retry submitted this one for (set once its row is written).
    retry_of = models.CharField(_("retry of"), max_length=TASK_ID_MAX_LENGTH, blank=True, default="")
    #: The task whose submission replaced this one while it waited (a coalescing task's).
    superseded_by = models.CharField(_("superseded by"), max_length=TASK_ID_MAX_LENGTH, blank=True, default="")

    objects = KeyedTaskManager()

    class Meta:
        verbose_name = _("keyed task")
        verbose_name_plural = _("keyed tasks")
        ordering = ["-id"]
        constraints = [
            models.UniqueConstraint(fields=["task_id", "key", "ticket"], name="keyed_task_one_row_per_submission"),
        ]
        indexes = [
            models.Index(fields=["key", "-id"], name="keyed_task_key_recent"),
            models.Index(fields=["status", "-id"], name="keyed_task_status_recent"),
            models.Index(fields=["task_name", "-id"], name="keyed_task_name_recent"),
            models.Index(
                fields=["enqueued_at"],
                name="keyed_task_active",
                condition=models.Q(status__in=ACTIVE_STATUSES),
            ),
        ]
        # The operator's actions, each granted on its own (the admin and its log check them).
        permissions = [
            ("cancel_keyedtask", _("Can cancel a waiting keyed task")),
            ("retry_keyedtask", _("Can retry a failed keyed task")),
            ("release_keyedtask", _("Can release the stuck holder of a key")),
            ("pause_key", _("Can pause a key")),
            ("resume_key", _("Can resume a key")),
            ("change_key_limits", _("Can set a key's limit and rate")),
            ("stop_keyedtask", _("Can stop a running keyed task")),
            ("run_now_keyedtask", _("Can start a delayed keyed task now")),
        ]

    def __str__(self) -> str:
        return f"{self.task_name}[{self.task_id}] {self.key}#{self.ticket}"

    @property
    def waited(self) -> timedelta | None:
        """From submission, or from its due time if it was delayed, to its first start: the wait for its key
        (a recovery's or a retry's attempt does not wait for it again)."""
        started = self.first_started_at or self.started_at
        if started is None:
            return None
        return max(started - (self.due_at or self.enqueued_at), timedelta(0))

    @property
    def ran(self) -> timedelta | None:
        """From its last attempt's start to its end."""
        if self.started_at is None or self.finished_at is None:
            return None
        return self.finished_at - self.started_at


class LiveKey(KeyedTask):
    """No table of its own: the admin's live keys page, listed on the admin's home page beside the keyed
    tasks, so that an operator finds it from there. Who may view keyed tasks may view it."""

    class Meta:
        proxy = True
        verbose_name = _("live key")
        verbose_name_plural = _("live keys")
        default_permissions = ()


class KeyWord(models.Model):
    """A word of a key after its first, for the admin's search (``key_words``): ``("1001", "ledger:1001")``.
    Written by the records' writers when they first meet a key; its unique index is what the search reads."""

    word = models.CharField(_("word"), max_length=MAX_KEY_LENGTH)
    key = models.CharField(_("key"), max_length=MAX_KEY_LENGTH)

    class Meta:
        verbose_name = _("key word")
        verbose_name_plural = _("key words")
        default_permissions = ()
        constraints = [models.UniqueConstraint(fields=["word", "key"], name="keyed_key_word_unique")]

    def __str__(self) -> str:
        return f"{self.word} in {self.key}"


class IdempotencyKey(models.Model):
    """A submission that a duplicate within the window resolves to instead of running again."""

    fingerprint = models.CharField(_("fingerprint"), max_length=64, unique=True)
    #: Indexed: a coalescing submission hands the keys of the task it replaced to itself (``repoint``),
    #: so that a duplicate's lookup (``idempotency.resolve``) follows a short chain.
    task_id = models.CharField(_("task id"), max_length=TASK_ID_MAX_LENGTH, db_index=True)
    task_name = models.CharField(_("task name"), max_length=TASK_NAME_MAX_LENGTH)
    #: HMAC-SHA256, keyed with the project's secret, of the arguments an explicit key was claimed with
    #: ('' when not compared). Shown nowhere.
    arguments = models.CharField(_("arguments digest"), max_length=64, blank=True, default="")
    #: The explicit key as the caller gave it ('' for a task idempotent by its arguments, which are not shown).
    #: Indexed: the admin's search finds a key by its text.
    key = models.CharField(
        _("idempotency key"), max_length=IDEMPOTENCY_KEY_MAX_LENGTH, blank=True, default="", db_index=True
    )
    #: How many duplicate submissions it answered with its task, and when the last came.
    duplicates = models.PositiveIntegerField(_("duplicates answered"), default=0)
    last_duplicate_at = models.DateTimeField(_("last duplicate at"), null=True, blank=True)
    created_at = models.DateTimeField(_("created at"))
    expires_at = models.DateTimeField(_("expires at"), db_index=True)

    class Meta:
        verbose_name = _("idempotency key")
        verbose_name_plural = _("idempotency keys")
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"{self.task_name} -> {self.task_id}"
