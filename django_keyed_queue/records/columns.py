"""What the records' text columns can hold, on every supported database.

A submission's key, task id, task name and idempotency key are checked at
submission against these limits, so that a value no database can store is
refused before anything is written; free text the records keep (an error, a
worker's name) is made storable instead.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Field

#: The longest task id and task name a record holds (``KeyedTask``'s columns, and ``IdempotencyKey``'s).
TASK_ID_MAX_LENGTH = 255
TASK_NAME_MAX_LENGTH = 255
#: The longest explicit idempotency key (Stripe's bound): it is stored only as a digest, but it is shown.
IDEMPOTENCY_KEY_MAX_LENGTH = 255

#: How much of a refused value an error shows.
SHOWN_CHARS = 80


def unstorable(value: object, max_length: int | None = None) -> str | None:
    """Why no supported database can store ``value`` in a text column of ``max_length`` characters;
    None if every one can. PostgreSQL stores no NUL in text, and checks the length SQLite does not."""
    if not isinstance(value, str):
        return f"must be a str, got {type(value).__name__}"
    if "\x00" in value:
        return "contains a NUL character (\\x00), which PostgreSQL cannot store"
    if max_length is not None and len(value) > max_length:
        return f"is {len(value)} characters long, over the maximum of {max_length}"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"is not valid text: {exc.reason} at position {exc.start}"
    return None


def shown(value: object) -> str:
    """``repr(value)``, cut to ``SHOWN_CHARS``: an error names a value without echoing a huge one."""
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS]}... ({len(text)} characters)"


def storable_text(field: Field[Any, Any], value: str) -> str:
    """Free text made storable in ``field``: NUL shown as U+FFFD, cut to the column's length."""
    if "\x00" in value:
        value = value.replace("\x00", "\ufffd")
    if field.max_length is not None and len(value) > field.max_length:
        value = value[: field.max_length]
    return value


#: Columns of free text (an error, a worker's name, the arguments shown): made storable, not refused.
FREE_TEXT = frozenset(("error", "worker", "arguments"))
