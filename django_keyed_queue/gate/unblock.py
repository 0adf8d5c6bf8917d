"""Unblock: an operator runs again, or withdraws, the ticket that blocks its key, beside ``lua/unblock.lua``."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .base import grants
from .calls import ScriptCall, flag
from .keys import KeyNames
from .results import FinishResult
from .scripts import Code

if TYPE_CHECKING:
    from .gate import Gate

logger = logging.getLogger(__name__)

#: unblock.lua's ARGV, in its header's order.
ARGV = ("ticket", "retry", "dispatch_timeout_ms", "idle_horizon_ms")


def call(key: str, ticket: int, retry: bool, gate: Gate) -> ScriptCall:
    """``unblock.lua``'s call: run ``ticket`` again first (``retry``), or withdraw it."""
    n = KeyNames(key)
    argv: dict[str, Any] = {
        "ticket": ticket, "retry": flag(retry), "dispatch_timeout_ms": gate.dispatch_timeout_ms,
        "idle_horizon_ms": gate.idle_horizon_ms,
    }  # fmt: skip
    return ScriptCall("unblock", [n.meta, n.queue, n.messages, n.holders, n.wires], [argv[name] for name in ARGV])


def parse(key: str, ticket: int, retry: bool, reply: list[Any], read_pushed: Callable[[Any], bool]) -> FinishResult:
    """The code, and the tickets granted: the retried one itself, or those granted in the withdrawn one's place."""
    result = FinishResult(Code(reply[0]), grants(key, reply[1:], read_pushed))
    logger.debug("unblock key=%r ticket=%s retry=%s code=%s", key, ticket, retry, result.code.name)
    return result
