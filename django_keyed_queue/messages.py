"""The task message the gate stores with each ticket, and how it is (de)coded.

Arguments are encoded with the task's own serializer at submission, which is
also how unserializable arguments are refused before anything is written.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

from kombu.exceptions import EncodeError
from kombu.serialization import dumps, loads

from .exceptions import InvalidArguments

#: Message header carrying a granted ticket: {"key", "ticket", "dispatch"}.
HEADER = "keyed_queue"

# Options that only make sense in the process that called apply_async.
LOCAL_OPTIONS = frozenset({"producer", "connection", "router", "publisher", "add_to_parent"})


@dataclass(frozen=True)
class TaskMessage:
    task_name: str
    task_id: str
    args: tuple
    kwargs: dict
    options: dict

    def encode(self, serializer: str) -> bytes:
        payload = {"args": list(self.args), "kwargs": self.kwargs, "options": self.options}
        try:
            content_type, encoding, body = dumps(payload, serializer=serializer)
        except (EncodeError, TypeError, ValueError) as exc:
            raise InvalidArguments(
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
        }
        return json.dumps(envelope, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes) -> TaskMessage:
        envelope = json.loads(raw)
        content_type = envelope["content_type"]
        payload: dict[str, Any] = loads(
            base64.b64decode(envelope["body"]), content_type, envelope["encoding"], accept={content_type}
        )
        return cls(
            task_name=envelope["task"],
            task_id=envelope["id"],
            args=tuple(payload["args"]),
            kwargs=payload["kwargs"],
            options=payload["options"],
        )


def ticket_header(key: str, ticket: int, dispatch: int) -> dict:
    """The header that lets a message (or a local handoff) start ``ticket`` of ``key``."""
    return {HEADER: {"key": key, "ticket": ticket, "dispatch": dispatch}}


def portable_options(options: dict, *, drop: tuple[str, ...] = ()) -> dict:
    """The apply_async options worth storing for a later publish from another process."""
    return {k: v for k, v in options.items() if k not in LOCAL_OPTIONS and k not in drop and v is not None}
