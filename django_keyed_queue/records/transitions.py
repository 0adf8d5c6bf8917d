"""A record's transition: the unit of every worker-side write, buffered, merged and kept in the gate."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.utils.module_loading import import_string
from kombu.utils.encoding import safe_repr
from kombu.utils.json import dumps as kombu_json
from kombu.utils.json import loads as kombu_loads

from ..conf import settings
from .statuses import STATUS_RANK

ARGUMENTS_MAX_LENGTH = 2000

#: Fields a transition may carry besides status and attempts.
FIELDS = (
    *("worker", "error", "dispatched_at", "started_at", "first_started_at", "heartbeat_at", "finished_at"),
    "superseded_by",
)
#: Fields a missing row may be created from, as the gate keeps them (arguments already described).
CREATE_FIELDS = ("task_name", "enqueued_at", "arguments")


def describe_arguments(
    task_name: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    argsrepr: str | None = None,
    kwargsrepr: str | None = None,
) -> str:
    """The arguments as stored on the record: the project's redaction hook's, else the
    ``argsrepr``/``kwargsrepr`` the caller gave Celery (as the worker logs them), else their repr."""
    redact = settings.REDACT_ARGUMENTS
    if redact is not None:
        if isinstance(redact, str):
            redact = import_string(redact)
        args, kwargs = redact(task_name, args, kwargs)
        argsrepr = kwargsrepr = None
    shown_args = argsrepr if isinstance(argsrepr, str) else safe_repr(tuple(args))
    shown_kwargs = kwargsrepr if isinstance(kwargsrepr, str) else safe_repr(dict(kwargs))
    return f"args={shown_args} kwargs={shown_kwargs}"[:ARGUMENTS_MAX_LENGTH]


#: What a worker's ``create`` may hold instead of ``arguments``: described only when needed.
_RAW_ARGUMENTS = ("args", "kwargs", "argsrepr", "kwargsrepr")


def _described(create: dict[str, Any]) -> dict[str, Any]:
    """``create`` with its raw arguments replaced by their description."""
    if not any(name in create for name in _RAW_ARGUMENTS):
        return create
    raw = {name: create.get(name) for name in _RAW_ARGUMENTS}
    described = {k: v for k, v in create.items() if k not in _RAW_ARGUMENTS}
    described.setdefault(
        "arguments",
        describe_arguments(
            create["task_name"], raw["args"] or (), raw["kwargs"] or {},
            argsrepr=raw["argsrepr"], kwargsrepr=raw["kwargsrepr"],
        ),
    )  # fmt: skip
    return described


def _typed(values: Any, names: tuple[str, ...], raw: bytes) -> dict[str, Any]:
    """Those of ``values`` named in ``names`` (others are dropped), each of its column's type; else ValueError."""
    if not isinstance(values, dict):
        raise ValueError(f"a keyed task transition's fields are an object: {raw[:200]!r}")
    typed = {}
    for name, value in values.items():
        if name not in names:
            continue
        if name.endswith("_at"):  # a time; only the enqueue time is never empty
            fits = isinstance(value, datetime) or (value is None and name != "enqueued_at")
        else:
            fits = isinstance(value, str)
        if not fits:
            raise ValueError(f"a keyed task transition's {name} is not of its column's type: {raw[:200]!r}")
        typed[name] = value
    return typed


def outcome_field(task_id: str, ticket: int) -> str:
    """The name the gate keeps the outcome of a run of submission ``(task_id, key, ticket)`` under, in its key."""
    return f"{task_id}#{ticket}"


@dataclass
class Transition:
    """A submission's record moving to ``status`` in attempt ``attempts``; applied only if it moves the row forward.

    A submission is ``(task_id, key, ticket)``: Celery reuses a task id on purpose (``replace``,
    a resent signature), and each submission has a row of its own.
    """

    task_id: str
    key: str
    ticket: int
    status: str
    attempts: int
    #: Other fields to set (timestamps, worker, error): names from ``FIELDS``.
    fields: dict[str, Any] = field(default_factory=dict)
    #: What a missing row is created from: task_name, enqueued_at, and args and kwargs
    #: (described only if the row is really missing), or arguments.
    create: dict[str, Any] | None = None
    #: A delayed task took its ticket when due: its row, written without a ticket, is this one.
    joins: bool = False
    #: The gate key holding this run's outcome, deleted once the record is written.
    outcome_key: str | None = None
    #: The task message as the gate stores it, for a row that has none (what a rebuild needs).
    message: str | None = None
    #: When (``time.monotonic()``) a write of it first found no row: see ``KeyedTaskManager.apply``.
    missing_since: float | None = None
    #: Its row is most likely not written yet (its submission is younger than the record delay, after
    #: which the workers' writers write it): it is inserted first, and updated only if it was there.
    insert_first: bool = False
    #: Its submission's record is still kept in the gate (``Gate.finish`` handed it back, and it is
    #: merged in): deleted once this is written.
    record_kept: bool = False
    #: Not written before this ``time.monotonic()``: a transition that cannot make its row waits for
    #: the submission's row, which the workers' writers write only after the record delay.
    not_before: float | None = None

    @property
    def submission(self) -> tuple[str, str, int]:
        return (self.task_id, self.key, self.ticket)

    @property
    def outcome_field(self) -> str:
        """The name the gate keeps this run's outcome under, within its key."""
        return outcome_field(self.task_id, self.ticket)

    @property
    def order(self) -> tuple[int, int]:
        return (self.attempts, STATUS_RANK[self.status])

    def merged_with(self, later: Transition) -> Transition:
        first, last = (self, later) if self.order <= later.order else (later, self)
        return Transition(
            task_id=self.task_id,
            key=self.key,
            ticket=self.ticket,
            status=last.status,
            attempts=last.attempts,
            fields={**first.fields, **last.fields},
            create=last.create or first.create,
            joins=first.joins or last.joins,
            outcome_key=last.outcome_key or first.outcome_key,
            message=last.message or first.message,
            missing_since=min((t.missing_since for t in (first, last) if t.missing_since is not None), default=None),
            insert_first=first.insert_first or last.insert_first,
            record_kept=first.record_kept or last.record_kept,
            # One that can make its row never waits for another's.
            not_before=None
            if first.create or last.create
            else max(first.not_before or 0, last.not_before or 0) or None,
        )

    def row_to_create(self) -> dict[str, Any]:
        """The fields of the row to create when the transition finds none."""
        create = _described(dict(self.create or {}))
        if self.message:
            create["message"] = self.message
        return {
            **create, **self.fields,
            "task_id": self.task_id, "key": self.key, "ticket": self.ticket,
            "status": self.status, "attempts": self.attempts,
        }  # fmt: skip

    def to_json(self) -> bytes:
        """The transition as the gate keeps it until written (see ``finish``), without what makes a row:
        until the submission's row is written, the gate keeps its record in the same slot, which a
        writer makes the row from (an outcome kept by an earlier version may still carry ``create``)."""
        return kombu_json(
            {"task_id": self.task_id, "key": self.key, "ticket": self.ticket, "status": self.status,
             "attempts": self.attempts, "fields": self.fields, "joins": self.joins}
        ).encode()  # fmt: skip

    @classmethod
    def from_json(cls, raw: bytes) -> Transition:
        """A transition the gate kept (written by a worker of this project, decoded as JSON only); the gate's
        Redis may hold anything there: ValueError for what is not one, each value of its column's type."""
        try:
            data = kombu_loads(raw)  # kombu's JSON gives datetimes back as datetimes
        except (TypeError, KeyError, AttributeError) as exc:  # its object hook on a malformed "__type__"
            raise ValueError(f"not a keyed task transition: {raw[:200]!r}") from exc
        if not isinstance(data, dict) or not isinstance(data.get("status"), str) or data["status"] not in STATUS_RANK:
            raise ValueError(f"not a keyed task transition: {raw[:200]!r}")
        if not (isinstance(data.get("key"), str) and type(data.get("ticket")) is int):
            raise ValueError(f"a keyed task transition names its key and ticket: {raw[:200]!r}")
        if not (isinstance(data.get("task_id"), str) and type(data.get("attempts")) is int):
            raise ValueError(f"a keyed task transition names its task id and attempt: {raw[:200]!r}")
        fields = _typed(data.get("fields") or {}, FIELDS, raw)
        create = data.get("create")
        if create is not None:
            create = _typed(create, CREATE_FIELDS, raw)
        return cls(
            data["task_id"], data["key"], data["ticket"], data["status"], data["attempts"],
            fields, create, joins=bool(data.get("joins")),
        )  # fmt: skip
