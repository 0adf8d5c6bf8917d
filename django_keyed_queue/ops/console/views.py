"""A JSON health view a project can mount: ``path("keyed-queue/health/", health)``."""

from __future__ import annotations

from django.contrib.admin.views.decorators import staff_member_required
from django.http import HttpRequest, JsonResponse

from ...conf import settings
from ...process.state import console_gate
from ...records import submissions
from ...records.models import KeyedTask
from .live import stuck_keys, unrenewed_runs


def health(request: HttpRequest) -> JsonResponse:
    """Queue depth, oldest wait, stuck keys and runs whose worker may be lost (as the live keys page says),
    Redis reachable. No task arguments.

    Staff only unless ``KEYED_QUEUE_HEALTH_PUBLIC``; 503 when Redis does not answer.
    """
    if not settings.HEALTH_PUBLIC:
        return staff_member_required(_report)(request)
    return _report(request)


def _report(request: HttpRequest) -> JsonResponse:
    try:
        gate = console_gate()
        # Recent submissions count also while no worker runs; a request writes a bounded batch.
        submissions.write_page(gate)
        stuck: int | None = len(stuck_keys(gate))
        unrenewed: int | None = unrenewed_runs(gate)
    except Exception:
        stuck = unrenewed = None
    report: dict[str, object] = {
        "queue_depth": KeyedTask.objects.filter(status="waiting").count(),
        "running": KeyedTask.objects.filter(status="running").count(),
        "oldest_wait_seconds": KeyedTask.objects.waited_longest_seconds(),
    }
    report["stuck_keys"], report["unrenewed_runs"] = stuck, unrenewed
    report["redis_reachable"] = stuck is not None
    return JsonResponse(report, status=200 if report["redis_reachable"] else 503)
