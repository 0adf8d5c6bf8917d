"""Stop: a running attempt is stopped and keeps its slot until it has ended, beside ``lua/stop.lua``."""

from __future__ import annotations

import logging
from typing import Any

from .base import stored_text
from .calls import ScriptCall
from .keys import KeyNames
from .results import Stopping
from .scripts import Code

logger = logging.getLogger(__name__)

#: stop.lua's ARGV, in its header's order.
ARGV = ("ticket", "dispatch", "by", "how")


def call(key: str, ticket: int, dispatch: int, *, by: str, how: str) -> ScriptCall:
    """``stop.lua``'s call: stop the attempt of ``ticket`` its ``dispatch`` started (``by`` whom, ``how``)."""
    n = KeyNames(key)
    argv: dict[str, Any] = {"ticket": ticket, "dispatch": dispatch, "by": by, "how": how.replace("|", "/")}
    return ScriptCall("stop", [n.meta, n.holders], [argv[name] for name in ARGV])


def parse(key: str, ticket: int, reply: list[Any]) -> Stopping | None:
    """Who stopped the attempt first, when and how; None if that attempt does not run."""
    code, stopped_by, since_ms, stopped_how = reply
    logger.debug("stop key=%r ticket=%s code=%s", key, ticket, Code(code).name)
    if Code(code) is not Code.OK:
        return None
    return Stopping(stored_text(stopped_by), int(since_ms), stored_text(stopped_how))
