"""Every attempt's error, kept on the task's record: a retry's message carries the errors before it.

``self.retry()`` sends the task's next attempt as a new message; the attempt that fails for good
(or succeeds) writes the record's error with the earlier attempts' errors after its own. What a
message carries may have been written by anyone: only a list of text is read, cut to size.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

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
