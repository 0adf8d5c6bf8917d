"""The task message the gate stores with each ticket, and its (de)coding.

A submission, a retry in place and a delayed task joining its key's queue all
store the message ``gate_message`` makes, with the options ``send_options``
gives (what ``Task.apply_async`` would publish with). A submission and a retry
also store the message as Celery built it for the broker (``sent``, see
``building``), so that it is published later exactly as built. Arguments are
encoded with the task's serializer at submission, which is also how
unserializable arguments are refused before anything is written.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from django.utils import timezone
from kombu.exceptions import DecodeError, EncodeError
from kombu.serialization import dumps, loads, prepare_accept_content

from ..exceptions import MessageRefused, UnencodableArguments

if TYPE_CHECKING:
    from .task_type import KeyedTaskProtocol

#: Message header carrying a granted ticket: {"key", "ticket", "dispatch"}.
HEADER = "keyed_queue"

#: Header of a delayed task's message: the id its join takes, one per submission (Celery sends one
#: task id more than once, as for a replacement), so that only a copy of the same message is a duplicate.
#: A run whose message carries it is that join's run (``Run.begin`` records it as such).
JOIN_HEADER = "keyed_queue_join"

#: Header of every submitted message: when its producer submitted it (seconds since the epoch, its
#: clock), for the metrics' time waited for the key.
ENQUEUED_HEADER = "keyed_queue_enqueued"

# Options that only make sense in the process that called apply_async.
LOCAL_OPTIONS = frozenset({"producer", "connection", "router", "publisher", "add_to_parent"})
#: Options of a delayed task: it takes its ticket when due, and its stored message is published at once.
DELAY_OPTIONS = frozenset({"countdown", "eta"})


def is_delayed(options: Mapping[str, Any]) -> bool:
    """Sent with a ``countdown`` or ``eta``: it joins its key's queue when due."""
    return any(options.get(name) is not None for name in DELAY_OPTIONS)


def with_debounce(task: KeyedTaskProtocol, options: dict[str, Any]) -> dict[str, Any]:
    """The options Celery builds a task's message with: a debounced task's carries an eta its
    ``debounce`` ahead (its ticket is taken now; the message waits out the eta in the broker or a
    worker's main process, and a newer submission's grant replaces it meanwhile)."""
    ms = task.serial_debounce_ms
    return {**options, "countdown": ms / 1000} if ms else options


#: What a stored message's ``sent`` holds: Celery's broker message but for its arguments (``args`` and
#: ``kwargs`` of the message): its headers, properties, the body's third part (callbacks, errbacks,
#: chain, chord), where it goes, the names of the queues to declare, and how to publish it.
SENT_PARTS = {
    "headers": dict,
    "properties": dict,
    "embed": dict,
    "exchange": str,
    "routing_key": str,
    "declare": list,
    "publish": dict,
}


@dataclass(frozen=True)
class TaskMessage:
    task_name: str
    task_id: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    options: dict[str, Any]
    #: The message as Celery built it in the process that sent it (None: not built yet; see ``building``).
    sent: dict[str, Any] | None = None

    def encode(self, default_serializer: str, *, blocks: bool = False) -> bytes:
        """The stored form, encoded with the serializer the message goes with (else ``default_serializer``).

        ``blocks``: its task blocks its key when it fails for good (``on_failure="block"``), said in the
        envelope for the gate, which blocks the key if no worker knows the task (see ``Gate.cancel``).
        """
        payload = {"args": list(self.args), "kwargs": self.kwargs, "options": self.options}
        serializer = self.options.get("serializer") or default_serializer
        if self.sent is not None:
            payload["sent"] = self.sent
            serializer = self.sent["publish"].get("serializer") or serializer
        body: bytes | str  # text or bytes, as the serializer makes it (kombu's stub says text)
        try:
            content_type, encoding, body = dumps(payload, serializer=serializer)
        except (EncodeError, TypeError, ValueError) as exc:
            raise UnencodableArguments(
                f"arguments of {self.task_name} cannot be encoded with the {serializer!r} serializer: {exc}"
            ) from exc
        if isinstance(body, str):
            body = body.encode(encoding or "utf-8")
        envelope = {
            "task": self.task_name,
            "id": self.task_id,
            "content_type": content_type,
            "encoding": encoding,
            "body": base64.b64encode(body).decode("ascii"),
            **({"on_failure": "block"} if blocks else {}),
        }
        return json.dumps(envelope, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes, accept: Iterable[str]) -> TaskMessage:
        """The message stored as ``raw``, if its body is in a format of ``accept`` (the app's ``accept_content``).

        What Redis or the database holds may have been written by someone else:
        a body in any other format (pickle, when the app does not accept it) is
        never decoded, and a malformed one is refused too (``MessageRefused``).
        """
        task_name, task_id, envelope = cls.peek(raw)
        content_type = envelope.get("content_type")
        if not isinstance(content_type, str) or content_type not in _content_types(frozenset(accept)):
            raise MessageRefused(task_name, task_id, f"its content type {content_type!r} is not in accept_content")
        try:
            body = base64.b64decode(envelope["body"], validate=True)
            # content_type passed the accept check (a str); kombu's loads takes None for an encoding (its stub: str).
            payload = loads(body, content_type, envelope.get("encoding"), accept={content_type})  # type: ignore[arg-type]
            sent = payload.get("sent")
            message = cls(task_name, task_id, tuple(payload["args"]), payload["kwargs"], payload["options"], sent)
        except (DecodeError, binascii.Error, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise MessageRefused(task_name, task_id, f"it is malformed: {exc!r}") from exc
        if not (isinstance(message.kwargs, dict) and isinstance(message.options, dict)):
            raise MessageRefused(task_name, task_id, "its kwargs and options must be mappings")
        if sent is not None and not _well_formed(sent):
            raise MessageRefused(task_name, task_id, "its sent message is malformed")
        return message

    @staticmethod
    def peek(raw: bytes) -> tuple[str, str, dict[str, Any]]:
        """The task name and id of a stored message, and its envelope (JSON), without decoding its body."""
        try:
            envelope = json.loads(raw)
            task_name, task_id = envelope["task"], envelope["id"]
        except (ValueError, TypeError, KeyError) as exc:
            raise MessageRefused("?", "?", f"its envelope is malformed: {exc!r}") from exc
        if not (isinstance(task_name, str) and isinstance(task_id, str)):
            raise MessageRefused(str(task_name), str(task_id), "its task name and id must be text")
        return task_name, task_id, envelope


@lru_cache(maxsize=16)
def _content_types(accept: frozenset[str]) -> frozenset[str]:
    """The content types ``accept`` (an app's ``accept_content``: names or types) lets in, as kombu reads it."""
    # kombu returns a set when given one; its stub allows None.
    return frozenset(prepare_accept_content(set(accept)))  # type: ignore[arg-type]


def _well_formed(sent: object) -> bool:
    """A stored ``sent`` has each of its parts, of the right type, and only text names queues to declare."""
    return (
        isinstance(sent, dict)
        and set(sent) == set(SENT_PARTS)
        and all(isinstance(sent[part], kind) for part, kind in SENT_PARTS.items())
        and all(isinstance(name, str) for name in sent["declare"])
        and sent["headers"].get("id") is not None
    )


def ticket_header(key: str, ticket: int, dispatch: int) -> dict[str, Any]:
    """The header that lets a message (or a local handoff) start ``ticket`` of ``key``."""
    return {HEADER: {"key": key, "ticket": ticket, "dispatch": dispatch}}


def send_options(
    task: KeyedTaskProtocol, args: tuple[Any, ...], kwargs: dict[str, Any], options: dict[str, Any]
) -> dict[str, Any]:
    """The options ``Task.apply_async`` would publish with: the task's own under the caller's.

    A relative ``expires`` becomes a time counted from now, as Celery counts it,
    not from when a parked task is finally published.
    """
    # Celery's Task has _get_exec_options; celery-types leaves it out.
    own = task._get_exec_options().items()  # type: ignore[attr-defined]
    sent: dict[str, Any] = {name: value for name, value in own if value is not None}
    sent.update(options)
    sent.setdefault("ignore_result", task.ignore_result)
    if sent.get("shadow") is None:
        sent["shadow"] = task.shadow_name(args, kwargs, options)
    expires = sent.get("expires")
    if isinstance(expires, (int, float)) and not isinstance(expires, bool):
        sent["expires"] = timezone.now() + timedelta(seconds=expires)
    return sent


def gate_message(
    task_name: str,
    task_id: str,
    args: Iterable[Any],
    kwargs: Mapping[str, Any],
    options: Mapping[str, Any],
    sent: dict[str, Any] | None = None,
) -> TaskMessage:
    """The message stored with a ticket of ``task``: every option another process needs to publish it by name,
    and the message as Celery built it, if it did (``sent``).

    ``options`` as ``send_options`` gives them, or as a worker's request holds them.
    """
    stored = {
        name: value
        for name, value in options.items()
        if name not in LOCAL_OPTIONS and name not in DELAY_OPTIONS and name != "task_id" and value is not None
    }
    return TaskMessage(task_name, task_id, tuple(args), dict(kwargs), stored, sent)


def sent_eta(message: TaskMessage) -> datetime | None:
    """When the message as Celery built it may start (its ``eta`` header), aware; None if it has none."""
    eta = (message.sent or {}).get("headers", {}).get("eta")
    try:
        moment = datetime.fromisoformat(eta) if isinstance(eta, str) else None
    except ValueError:
        return None
    return moment.replace(tzinfo=UTC) if moment is not None and moment.tzinfo is None else moment
