"""Run now: an operator starts a granted ticket that waits for its key's rate or an eta, beside
``lua/run_now.lua``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from .calls import ScriptCall
from .keys import KeyNames
from .results import Grant
from .scripts import Code

if TYPE_CHECKING:
    from .gate import Gate

logger = logging.getLogger(__name__)

#: run_now.lua's ARGV, in its header's order.
ARGV = ("ticket", "dispatch", "dispatch_timeout_ms")


def call(key: str, ticket: int, dispatch: int, gate: Gate) -> ScriptCall:
    """``run_now.lua``'s call: the grant of ``ticket`` with ``dispatch`` goes out again, to start now."""
    n = KeyNames(key)
    argv: dict[str, Any] = {"ticket": ticket, "dispatch": dispatch, "dispatch_timeout_ms": gate.dispatch_timeout_ms}
    return ScriptCall("run_now", [n.meta, n.holders, n.messages, n.wires], [argv[name] for name in ARGV])


def parse(key: str, ticket: int, reply: list[Any]) -> Grant | None:
    """The grant to publish again, with its next dispatch; None if it is not granted with that dispatch."""
    code, new_dispatch, message = reply
    logger.debug("run_now key=%r ticket=%s code=%s", key, ticket, Code(code).name)
    return Grant(key, ticket, int(new_dispatch), message) if Code(code) is Code.OK else None
