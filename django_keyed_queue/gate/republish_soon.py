"""Republish soon: the reaper publishes a granted ticket's message again after a delay, not at its
dispatch deadline, beside ``lua/republish_soon.lua``.
"""

from __future__ import annotations

import logging
from typing import Any

from .calls import ScriptCall, flag, or_empty
from .keys import KeyNames
from .scripts import Code

logger = logging.getLogger(__name__)

#: republish_soon.lua's ARGV, in its header's order.
ARGV = ("ticket", "dispatch", "delay_ms", "undelivered_keep_ms", "later")


def call(
    key: str, ticket: int, dispatch: int, *, delay_ms: int, undelivered_keep_ms: int | None = None, later: bool = False
) -> ScriptCall:
    """With ``undelivered_keep_ms``, the drop is counted (for that long); ``later``: the deadline is set also
    if it is later than the one it had (a message that went out with an eta)."""
    n = KeyNames(key)
    argv: dict[str, Any] = {
        "ticket": ticket, "dispatch": dispatch, "delay_ms": delay_ms,
        "undelivered_keep_ms": or_empty(undelivered_keep_ms), "later": flag(later),
    }  # fmt: skip
    keys = [n.holders] if undelivered_keep_ms is None else [n.holders, n.undelivered]
    return ScriptCall("republish_soon", keys, [argv[name] for name in ARGV])


def parse(key: str, ticket: int, reply: list[Any]) -> int | None:
    """How many times the ticket was dropped undelivered (0 uncounted), or None if it is not granted with
    that dispatch."""
    code, *drops = reply
    logger.debug("republish_soon key=%r ticket=%s code=%s", key, ticket, Code(code).name)
    return int(drops[0]) if Code(code) is Code.OK else None
