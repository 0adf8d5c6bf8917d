"""What a submission checks before anything is written: its key, its arguments, what its record must hold.

Bad input raises ``KeyedQueueError`` naming what was wrong, and nothing is written: no
ticket, no row, no message, no claim.
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from celery.utils import uuid

from ..exceptions import InvalidArguments
from ..messaging.message import ENQUEUED_HEADER, JOIN_HEADER, is_delayed, send_options
from ..records import idempotency
from ..records.columns import TASK_ID_MAX_LENGTH, TASK_NAME_MAX_LENGTH, shown, unstorable

if TYPE_CHECKING:
    from ..messaging.task_type import KeyedTaskProtocol


@dataclass(frozen=True)
class Checked:
    """A submission checked, with nothing written: what it sends, its key and its idempotency claim."""

    task_id: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    #: As ``message.send_options`` gives them.
    options: dict[str, Any]
    key: str
    fingerprint: str | None
    claimed_with: dict[str, Any]


@dataclass(frozen=True)
class KeyedArguments:
    """A call's arguments as sent, bound to the task's signature, and the key they make."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    bound: inspect.BoundArguments
    key: str


def keyed_arguments(
    task: KeyedTaskProtocol, args: tuple[Any, ...], kwargs: dict[str, Any], serializer: str | None
) -> KeyedArguments:
    """The arguments as sent, bound, and their key; raises ``InvalidArguments`` or ``InvalidKey``.

    ``pydantic=True`` tasks (Celery 5.7+) send their models as dicts, as Celery's
    ``apply_async`` does, and the key is made from the arguments as sent, because
    that is what the worker holds when it checks the message's key.
    """
    bound = task._bind(args, kwargs)
    dump = getattr(task, "_dump_pydantic_arguments", None)
    if dump is not None and serializer != "pickle":
        args, kwargs = dump(args, kwargs)
        args, bound = tuple(args), task._bind(args, kwargs)
    return KeyedArguments(args, kwargs, bound, task.key_for(args, kwargs, bound))


def check(
    task: KeyedTaskProtocol,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    options: dict[str, Any],
    idempotency_key: str | None,
) -> Checked:
    """Everything a submission checks before it writes anything (``KeyedQueueError`` on bad input).

    ``options`` are the caller's, left as they are."""
    if task.soft_time_limit and task.time_limit and task.soft_time_limit > task.time_limit:
        raise ValueError("soft_time_limit must be less than or equal to time_limit")  # as Celery's apply_async
    options = dict(options)
    task_id = options.pop("task_id", None) or uuid()
    check_storable(task, task_id, options)
    options = send_options(task, args, kwargs, options)
    call = keyed_arguments(task, args, kwargs, options.get("serializer"))
    if task.serial_debounce_ms and is_delayed(options):
        raise InvalidArguments(
            f"{task.name}: a debounced task starts {task.serial_debounce_ms / 1000:g}s after its key's last "
            "submission of it; countdown and eta cannot be given"
        )
    stamps: dict[str, Any] = {ENQUEUED_HEADER: round(time.time(), 3)}
    if is_delayed(options):
        stamps[JOIN_HEADER] = uuid()
    options["headers"] = {**(options.get("headers") or {}), **stamps}
    fingerprint, claimed_with = None, {}
    if idempotency_key is not None:
        fingerprint = idempotency.explicit_fingerprint(task.name, idempotency_key)
        claimed_with = {
            "key": idempotency_key,
            "arguments": idempotency.arguments_digests(task.name, call.bound.arguments),
        }
    elif task.idempotent:
        fingerprint = idempotency.arguments_fingerprint(task.name, call.bound.arguments)
    return Checked(task_id, call.args, call.kwargs, options, call.key, fingerprint, claimed_with)


def check_storable(task: KeyedTaskProtocol, task_id: object, options: dict[str, Any]) -> None:
    """Refuse what the submission's record could not hold on some supported database (``InvalidArguments``
    naming the field): the key is checked with the arguments, an idempotency key when it is claimed."""
    fields = {
        "task name": (task.name, TASK_NAME_MAX_LENGTH),
        "task_id": (task_id, TASK_ID_MAX_LENGTH),
        # Shown in the record's arguments instead of them (cut to their length there).
        **{name: (options[name], None) for name in ("argsrepr", "kwargsrepr") if isinstance(options.get(name), str)},
    }
    for field, (value, max_length) in fields.items():
        problem = unstorable(value, max_length)
        if problem:
            named = task.name if field != "task name" else "a keyed task"
            raise InvalidArguments(f"{named}: {field} {shown(value)} {problem}")
