"""Refuse join: a delayed task that has not joined its key's queue never will, beside
``lua/refuse_join.lua``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from .calls import ScriptCall
from .keys import KeyNames
from .scripts import Code, seconds_to_ms

if TYPE_CHECKING:
    from .gate import Gate

logger = logging.getLogger(__name__)

#: refuse_join.lua's ARGV, in its header's order.
ARGV = ("join_id", "due_in_ms", "idle_horizon_ms")


def call(key: str, task_id: str, gate: Gate, *, due_in_seconds: float) -> ScriptCall:
    """``refuse_join.lua``'s call: mark ``task_id`` refused until it is due, ``due_in_seconds`` from now."""
    argv: dict[str, Any] = {
        "join_id": task_id,
        "due_in_ms": seconds_to_ms(due_in_seconds),
        "idle_horizon_ms": gate.idle_horizon_ms,
    }
    return ScriptCall("refuse_join", [KeyNames(key).joined], [argv[name] for name in ARGV])


def parse(key: str, task_id: str, reply: list[Any]) -> bool:
    """True if refused; False if it joined already (it has a ticket)."""
    [code] = reply
    logger.debug("refuse join key=%r task_id=%s code=%s", key, task_id, Code(code).name)
    return Code(code) is Code.OK
