"""Every attempt's error, kept on the task's record: a retry's message carries the errors before it.

``self.retry()`` sends the task's next attempt as a new message; the attempt that fails for good
(or succeeds) writes the record's error with the earlier attempts' errors after its own. What a
message carries may have been written by anyone: only a list of text is read, cut to size.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.utils import timezone

from ..process.state import worker_gate
from ..records.models import KeyedTask

if TYPE_CHECKING:
    from celery.app.task import Context

#: The retry message's header with the errors of the attempts before it, oldest first.
ERRORS_HEADER = "keyed_queue_errors"
#: The most recent attempts whose errors are kept, and how much of each.
KEPT_ERRORS = 10
ERROR_CHARS = 2000


def earlier_errors(request: Context) -> list[str]:
    """The errors of the attempts before this one, as the message carried them."""
    errors = getattr(request, ERRORS_HEADER, None)
    if not isinstance(errors, list):
        return []
    return [error[:ERROR_CHARS] for error in errors if isinstance(error, str)][-KEPT_ERRORS:]


def carried(earlier: list[str], attempt: int, error: str) -> list[str]:
    """What the next attempt's message carries: the earlier errors and this attempt's."""
    return [*earlier, f"attempt {attempt}: {error}"[:ERROR_CHARS]][-KEPT_ERRORS:]


def with_earlier(error: str, earlier: list[str]) -> str:
    """The record's error: this attempt's (if it failed), then the earlier attempts', newest first."""
    if not earlier:
        return error
    shown = "\n\n".join(reversed(earlier))
    return f"{error}\n\nEarlier attempts:\n\n{shown}" if error else f"Earlier attempts:\n\n{shown}"


#: How a run's record says Celery reported its child process lost (``WorkerLostError``); the attempt is
#: named by its dispatch. The run still holds its key until its lease ends.
LOST_PROCESS = "its worker process was lost (dispatch {dispatch})"


def lost_process(dispatch: int) -> str:
    return LOST_PROCESS.format(dispatch=dispatch)


def note_lost_process(task_id: str, header: object, exc: BaseException) -> bool:
    """Celery's worker reported the process running ``task_id`` lost: say so on its record, while it still
    runs (an operator then sees the run is dead, not running, until its lease ends). The attempt is the
    one the message's ``header`` names; without one (Celery before 5.5 gives no request with its signal),
    the attempt its ticket's slot runs now, if that slot is the task's own. Whether a record was changed."""
    attempt = _named_attempt(header) if header is not None else _running_attempt(task_id)
    if attempt is None:
        return False
    key, ticket, dispatch = attempt
    note = f"{lost_process(dispatch)} at {timezone.now().isoformat(timespec='milliseconds')}: {exc!r}"
    return KeyedTask.objects.note_running(task_id, key, ticket, error=note[:ERROR_CHARS]) > 0


def _named_attempt(header: object) -> tuple[str, int, int] | None:
    """The key, ticket and dispatch a message's ticket header names; None if it names none."""
    if not isinstance(header, dict):
        return None
    try:
        return str(header["key"]), int(header["ticket"]), int(header["dispatch"])
    except (KeyError, TypeError, ValueError):
        return None


def _running_attempt(task_id: str) -> tuple[str, int, int] | None:
    """The key, ticket and dispatch of ``task_id``'s run, as its ticket's slot holds it now; None if it runs
    none (its lease ended, or its ticket is another task's)."""
    row = KeyedTask.objects.filter(task_id=task_id, ticket__isnull=False).order_by("-id").only("key", "ticket").first()
    if row is None or row.ticket is None:
        return None
    slot = worker_gate().inspect(row.key, waiting_shown=0).held_by(row.ticket, task_id)
    return (row.key, row.ticket, slot.dispatch) if slot is not None and slot.state == "running" else None
