"""Cancel: withdraw a ticket that has not started, beside ``lua/cancel.lua``.

A ``Cancel`` is built once, by the producer whose submission failed, the worker that cannot run a
message or the operator, and passed unchanged to ``Gate.cancel``; ``ARGV`` names the script's
arguments in its header's order (``tests/gate/test_scripts.py`` checks the two agree).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .base import grants
from .calls import ScriptCall, flag, or_empty
from .keys import KeyNames
from .results import FinishResult
from .scripts import Code

if TYPE_CHECKING:
    from .gate import Gate

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Cancel:
    """Withdraw ``ticket`` of ``key`` if it has not started."""

    key: str
    ticket: int
    #: None: the key's own, as its submissions set it.
    limit: int | None = None
    #: Its submission failed before anyone saw its ticket (implies ``failed``): the ticket number is given
    #: back when it was the last one taken.
    forget: bool = False
    #: Its submission failed: its record is dropped if its row is not written yet.
    failed: bool = False
    #: With ``task_id``, the attempt withdrawn: a ticket not granted with this dispatch, or whose stored
    #: message is another task's, is left as it is (``Code.NOT_GRANTED``).
    dispatch: int | None = None
    task_id: str = ""
    #: Its task failed without starting: a granted ticket whose stored message says its task blocks its
    #: key on failure is blocked instead (``Code.BLOCKED``).
    failed_for_good: bool = False


#: cancel.lua's ARGV, in its header's order.
ARGV = (
    "ticket", "limit", "dispatch_timeout_ms", "idle_horizon_ms", "forget", "failed", "dispatch", "task_id",
    "failed_for_good",
)  # fmt: skip


def call(cancel: Cancel, gate: Gate) -> ScriptCall:
    c = cancel
    argv: dict[str, Any] = {
        "ticket": c.ticket, "limit": or_empty(c.limit),
        "dispatch_timeout_ms": gate.dispatch_timeout_ms, "idle_horizon_ms": gate.idle_horizon_ms,
        "forget": flag(c.forget), "failed": flag(c.failed or c.forget),
        "dispatch": or_empty(c.dispatch), "task_id": c.task_id,
        "failed_for_good": flag(c.failed_for_good),
    }  # fmt: skip
    n = KeyNames(c.key)
    keys = [n.meta, n.queue, n.messages, n.holders, n.recent, n.recent_older, n.unwritten, n.wires]
    return ScriptCall("cancel", keys, [argv[name] for name in ARGV])


def parse(cancel: Cancel, reply: list[Any], read_pushed: Callable[[Any], bool]) -> FinishResult:
    """The code, and the tickets granted in the withdrawn one's place."""
    result = FinishResult(Code(reply[0]), grants(cancel.key, reply[1:], read_pushed))
    logger.debug("cancel key=%r ticket=%s code=%s", cancel.key, cancel.ticket, result.code.name)
    return result
