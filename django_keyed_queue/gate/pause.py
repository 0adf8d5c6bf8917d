"""Pause and resume: a key grants nothing more, or grants again, beside ``lua/pause.lua``."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .base import grants
from .calls import ScriptCall, flag
from .keys import KeyNames
from .results import Grant
from .scripts import Code

if TYPE_CHECKING:
    from .gate import Gate

logger = logging.getLogger(__name__)

#: Who paused a key is kept to this many characters (an operator's name; a command's own words).
PAUSED_BY_MAX = 200

#: pause.lua's ARGV, in its header's order.
ARGV = ("pause", "dispatch_timeout_ms", "idle_horizon_ms", "paused_by")


def call(key: str, gate: Gate, *, pause: bool, by: str = "") -> ScriptCall:
    """``pause.lua``'s call: pause ``key`` (``by`` whom), or resume it."""
    argv: dict[str, Any] = {
        "pause": flag(pause), "dispatch_timeout_ms": gate.dispatch_timeout_ms,
        "idle_horizon_ms": gate.idle_horizon_ms, "paused_by": by[:PAUSED_BY_MAX] if pause else "",
    }  # fmt: skip
    n = KeyNames(key)
    return ScriptCall("pause", [n.meta, n.queue, n.messages, n.holders, n.wires], [argv[name] for name in ARGV])


def paused(reply: list[Any]) -> bool:
    """Whether a pause paused its key (False: it was paused already, and keeps that pause)."""
    return Code(reply[0]) is Code.OK


def parse(key: str, reply: list[Any], read_pushed: Callable[[Any], bool]) -> list[Grant] | None:
    """The tickets a resume granted, or None if the key was not paused (nothing changed)."""
    logger.debug("pause key=%r code=%s", key, Code(reply[0]).name)
    return None if reply[0] == Code.NOT_PAUSED else grants(key, reply[1:], read_pushed)
