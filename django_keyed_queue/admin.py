from django.contrib import admin

from .changelist import CursorChangeList, TaskNameFilter
from .models import IdempotencyKey, KeyedTask


@admin.register(KeyedTask)
class KeyedTaskAdmin(admin.ModelAdmin):
    list_display = ("task_id", "task_name", "key", "ticket", "status", "attempts", "enqueued_at", "finished_at")
    list_filter = ("status", TaskNameFilter)
    search_fields = ("=key", "=task_id")
    readonly_fields = [f.name for f in KeyedTask._meta.fields if f.name != "message"]
    exclude = ("message",)
    show_full_result_count = False

    def has_add_permission(self, request) -> bool:
        return False

    def get_changelist(self, request, **kwargs):
        return CursorChangeList


@admin.register(IdempotencyKey)
class IdempotencyKeyAdmin(admin.ModelAdmin):
    list_display = ("fingerprint", "task_name", "task_id", "created_at", "expires_at")
    search_fields = ("=fingerprint", "=task_id")
    readonly_fields = [f.name for f in IdempotencyKey._meta.fields]
    show_full_result_count = False

    def has_add_permission(self, request) -> bool:
        return False
