"""Override: an operator's limit and rate for a key over its tasks' own, beside ``lua/override.lua``."""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .base import grants
from .calls import ScriptCall
from .keys import KeyNames
from .results import Grant

if TYPE_CHECKING:
    from .gate import Gate

logger = logging.getLogger(__name__)


class Unchanged(enum.Enum):
    """``set_overrides``'s word for "leave it as it is"."""

    UNCHANGED = "unchanged"


UNCHANGED = Unchanged.UNCHANGED

#: override.lua's ARGV, in its header's order.
ARGV = ("limit", "interval_ms", "dispatch_timeout_ms", "idle_horizon_ms")


def override_value(value: int | None | Unchanged) -> str:
    """An override as ``override.lua`` takes it: '-' unchanged, '' cleared, else the number."""
    if value is UNCHANGED:
        return "-"
    if value is None:
        return ""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"an override is an int >= 1 or None, got {value!r}")
    return str(value)


def call(key: str, gate: Gate, *, limit: int | None | Unchanged, interval_ms: int | None | Unchanged) -> ScriptCall:
    """``override.lua``'s call; a value that is no override raises ``ValueError`` before anything is sent."""
    argv: dict[str, Any] = {
        "limit": override_value(limit), "interval_ms": override_value(interval_ms),
        "dispatch_timeout_ms": gate.dispatch_timeout_ms, "idle_horizon_ms": gate.idle_horizon_ms,
    }  # fmt: skip
    n = KeyNames(key)
    return ScriptCall("override", [n.meta, n.queue, n.messages, n.holders, n.wires], [argv[name] for name in ARGV])


def parse(key: str, reply: list[Any], read_pushed: Callable[[Any], bool]) -> tuple[list[int], list[Grant]]:
    """The tickets taken back (they wait again) and those granted at once."""
    withdrawn = [int(t) for t in reply[2 : 2 + int(reply[1])]]
    logger.debug("override key=%r withdrawn=%s", key, withdrawn)
    return withdrawn, grants(key, reply[2 + len(withdrawn) :], read_pushed)
