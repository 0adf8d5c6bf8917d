"""The keyed task list in the admin: filters and pagination that stay fast at millions of rows."""

from __future__ import annotations

from celery import current_app
from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.utils.translation import gettext_lazy as _


class TaskNameFilter(admin.SimpleListFilter):
    """Task names from the registered keyed tasks, not from a DISTINCT over every row."""

    title = _("task name")
    parameter_name = "task_name"

    def lookups(self, request, model_admin):
        from .task import KeyedSerialTask

        names = sorted(name for name, task in current_app.tasks.items() if isinstance(task, KeyedSerialTask))
        return [(name, name) for name in names]

    def queryset(self, request, queryset):
        if self.value():
            return queryset.filter(task_name=self.value())
        return queryset


class CursorChangeList(ChangeList):
    """The admin's change list; pagination to be replaced by a cursor over ``-id``."""
