"""Submit: take the next ticket of a key and keep its message, beside ``lua/submit.lua``.

A ``Submission`` is built once, by the producer or by a delayed task's join on the worker, and
passed unchanged to ``Gate.submit`` or ``Gate.submit_many``; ``call`` makes its script call and
``parse`` reads the reply. ``ARGV`` names the script's arguments in its header's order
(``tests/gate/test_scripts.py`` checks the two agree).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .base import text
from .calls import ScriptCall, flag
from .keys import KeyNames
from .results import QueueFull, SubmitResult
from .scripts import Code, seconds_to_ms

if TYPE_CHECKING:
    from .gate import Gate

logger = logging.getLogger(__name__)

#: A submission asked again after its reply was lost finds its ticket for at least this long.
RECENT_SUBMISSION_SECONDS = 30.0


@dataclass(frozen=True)
class Submission:
    """One submission of a task's message to its key's queue."""

    key: str
    message: bytes
    #: Remembered, so that a submission asked again after a lost reply finds its ticket ('' = not).
    task_id: str = ""
    #: Its record (``records/submissions.py``), kept with the ticket until its row is written; b'': none.
    record: bytes = b""
    limit: int = 1
    #: > 0: refused (``QueueFull``), taking nothing, when the ticket would wait behind that many.
    max_waiting: int = 0
    #: The message's broker template (``messaging/wire.py``), pushed by the call that grants the ticket;
    #: b'': none, its grant is published.
    wire: bytes = b""
    #: The task's name if it coalesces: this ticket, if it must wait, replaces the one of that task
    #: waiting (``SubmitResult.superseded``); '': it does not.
    coalesce: str = ""
    #: > 0: the task is debounced by that many ms (its message carries the eta): a granted ticket of it
    #: not started yet is replaced too, and a grant's dispatch deadline runs from the eta.
    debounce_ms: int = 0
    #: A delayed task joining its queue on the worker that holds it: a granted ticket is started too
    #: (``max_lost`` and ``block`` as for ``Gate.start``), and a ``join_id`` seen within the idle horizon
    #: makes it a duplicate (``Gate.submit`` returns None, nothing changed).
    start: bool = False
    join_id: str = ""
    max_lost: int = 0
    block: bool = False


#: submit.lua's ARGV, in its header's order.
ARGV = (
    "message", "limit", "dispatch_timeout_ms", "lease_ms", "join_id", "idle_horizon_ms", "max_lost", "retried",
    "task_id", "max_waiting", "generation_ms", "record", "block", "wire", "coalesce", "debounce_ms",
)  # fmt: skip


def call(submission: Submission, gate: Gate, *, retried: bool = False) -> ScriptCall:
    """``submit.lua``'s call of ``submission`` with ``gate``'s durations; ``retried``: asked again after a
    lost reply (the ticket this task id took, if it still holds exactly this message, is returned as is)."""
    s = submission
    argv: dict[str, Any] = {
        "message": s.message, "limit": s.limit, "dispatch_timeout_ms": gate.dispatch_timeout_ms,
        "lease_ms": gate.lease_ms if s.start else 0, "join_id": s.join_id, "idle_horizon_ms": gate.idle_horizon_ms,
        "max_lost": s.max_lost, "retried": "1" if retried else "", "task_id": s.task_id,
        "max_waiting": s.max_waiting, "generation_ms": seconds_to_ms(RECENT_SUBMISSION_SECONDS), "record": s.record,
        "block": flag(s.block), "wire": s.wire, "coalesce": s.coalesce, "debounce_ms": s.debounce_ms,
    }  # fmt: skip
    n = KeyNames(s.key)
    keys = [n.meta, n.queue, n.messages, n.holders, n.joined, n.recent, n.recent_older, n.unwritten, n.wires]
    return ScriptCall("submit", keys, [argv[name] for name in ARGV])


def parse(
    submission: Submission, reply: list[Any], read_pushed: Callable[[Any], bool]
) -> SubmitResult | QueueFull | None:
    """The result of ``submission``'s reply: None for a join seen before (a duplicate), ``QueueFull`` for a
    key at its ``max_waiting`` (nothing taken)."""
    code, ticket, token, _, pushed, *replaced = reply
    if code == Code.DUPLICATE:
        logger.debug("submit key=%r join_id=%s duplicate", submission.key, submission.join_id)
        return None
    if code == Code.QUEUE_FULL:
        return QueueFull(submission.key, int(ticket))
    superseded = (int(replaced[0]), text(replaced[1])) if replaced and int(replaced[0]) else None
    result = SubmitResult(
        ticket=int(ticket), granted=code == Code.OK, token=int(token), pushed=read_pushed(pushed), superseded=superseded
    )
    logger.debug("submit key=%r ticket=%s granted=%s", submission.key, result.ticket, result.granted)
    return result
