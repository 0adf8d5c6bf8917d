"""The statuses a keyed task record moves through."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


class Status(models.TextChoices):
    WAITING = "waiting", _("waiting")
    DISPATCHED = "dispatched", _("dispatched")
    RUNNING = "running", _("running")
    RETRYING = "retrying", _("retrying")
    SUCCEEDED = "succeeded", _("succeeded")
    FAILED = "failed", _("failed")
    CANCELLED = "cancelled", _("cancelled")
    #: The task raised Celery's ``Ignore`` (or was replaced by ``self.replace()``): it ended without a result.
    IGNORED = "ignored", _("ignored")
    #: The task raised Celery's ``Reject(requeue=False)``: its message was dropped.
    REJECTED = "rejected", _("rejected")
    #: A newer submission of its coalescing task replaced it while it waited: it never ran.
    SUPERSEDED = "superseded", _("superseded")


TERMINAL_STATUSES = (
    Status.SUCCEEDED, Status.FAILED, Status.CANCELLED, Status.IGNORED, Status.REJECTED, Status.SUPERSEDED,
)  # fmt: skip
ACTIVE_STATUSES = (Status.WAITING, Status.DISPATCHED, Status.RUNNING, Status.RETRYING)

#: Order of statuses within one attempt; a record never moves back in it.
STATUS_RANK: dict[str, int] = {
    Status.WAITING: 0,
    Status.DISPATCHED: 1,
    Status.RUNNING: 2,
    Status.RETRYING: 3,
    Status.SUCCEEDED: 4,
    Status.FAILED: 4,
    Status.CANCELLED: 4,
    Status.IGNORED: 4,
    Status.REJECTED: 4,
    Status.SUPERSEDED: 4,
}
