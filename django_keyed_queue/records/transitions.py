"""A record's transition: the unit of every worker-side write, buffered, merged and kept in the gate."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.utils.module_loading import import_string
from kombu.utils.encoding import safe_repr
from kombu.utils.json import dumps as kombu_json
from kombu.utils.json import loads as kombu_loads

from ..conf import settings
from .statuses import STATUS_RANK

ARGUMENTS_MAX_LENGTH = 2000

#: Fields a transition may carry besides status and attempts.
FIELDS = ("ticket", "worker", "error", "dispatched_at", "started_at", "heartbeat_at", "finished_at")
#: Fields a missing row may be created from, as the gate keeps them (arguments already described).
CREATE_FIELDS = ("task_name", "key", "enqueued_at", "arguments")


def describe_arguments(task_name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """The arguments as stored on the record, after the project's redaction hook."""
    redact = settings.REDACT_ARGUMENTS
    if redact is not None:
        if isinstance(redact, str):
            redact = import_string(redact)
        args, kwargs = redact(task_name, args, kwargs)
    text = f"args={safe_repr(tuple(args))} kwargs={safe_repr(dict(kwargs))}"
    return text[:ARGUMENTS_MAX_LENGTH]


@dataclass
class Transition:
    """One task's record moving to ``status`` in attempt ``attempts``; applied only if it moves the row forward."""

    task_id: str
    status: str
    attempts: int
    #: Other fields to set (timestamps, worker, error, ticket): names from ``FIELDS``.
    fields: dict[str, Any] = field(default_factory=dict)
    #: What a missing row is created from: task_name, key, enqueued_at, and args and
    #: kwargs (described only if the row is really missing).
    create: dict[str, Any] | None = None
    #: The gate key holding this run's outcome, deleted once the record is written.
    outcome_key: str | None = None

    @property
    def order(self) -> tuple[int, int]:
        return (self.attempts, STATUS_RANK[self.status])

    def merged_with(self, later: Transition) -> Transition:
        first, last = (self, later) if self.order <= later.order else (later, self)
        return Transition(
            task_id=self.task_id,
            status=last.status,
            attempts=last.attempts,
            fields={**first.fields, **last.fields},
            create=last.create or first.create,
            outcome_key=last.outcome_key or first.outcome_key,
        )

    def row_to_create(self) -> dict[str, Any]:
        """The fields of the row to create when the transition finds none."""
        create = dict(self.create or {})
        args, kwargs = create.pop("args", ()), create.pop("kwargs", {})
        if "arguments" not in create:
            create["arguments"] = describe_arguments(create["task_name"], args, kwargs)
        return {"task_id": self.task_id, "status": self.status, "attempts": self.attempts, **create, **self.fields}

    def to_json(self) -> bytes:
        """The transition as the gate keeps it until written (see ``finish``).

        Arguments go as the record shows them: any serializer's values may be in
        them, and JSON cannot hold them all.
        """
        create = self.create
        if create is not None and ("args" in create or "kwargs" in create):
            arguments = describe_arguments(create["task_name"], create.get("args", ()), create.get("kwargs", {}))
            create = {k: v for k, v in create.items() if k not in ("args", "kwargs")}
            create["arguments"] = arguments
        return kombu_json(
            {"task_id": self.task_id, "status": self.status, "attempts": self.attempts,
             "fields": self.fields, "create": create}
        ).encode()  # fmt: skip

    @classmethod
    def from_json(cls, raw: bytes) -> Transition:
        """A transition the gate kept (written by a worker of this project, decoded as JSON only)."""
        data = kombu_loads(raw)  # kombu's JSON gives datetimes back as datetimes
        if not isinstance(data, dict) or data.get("status") not in STATUS_RANK:
            raise ValueError(f"not a keyed task transition: {raw[:200]!r}")
        fields = {name: value for name, value in (data.get("fields") or {}).items() if name in FIELDS}
        create = data.get("create")
        if create is not None:
            create = {name: value for name, value in create.items() if name in CREATE_FIELDS}
        return cls(str(data["task_id"]), data["status"], int(data["attempts"]), fields, create)
