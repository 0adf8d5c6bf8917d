"""Retry: a running ticket keeps its slot through a retry's countdown, beside ``lua/retry.lua``.

The request is the run's ``Lease`` and the retry's message; ``ARGV`` names the script's arguments
in its header's order (``tests/gate/test_scripts.py`` checks the two agree).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from .calls import ScriptCall
from .keys import KeyNames
from .results import Lease
from .scripts import Code, seconds_to_ms

if TYPE_CHECKING:
    from .gate import Gate

logger = logging.getLogger(__name__)

#: retry.lua's ARGV, in its header's order.
ARGV = ("ticket", "token", "countdown_ms", "dispatch_timeout_ms", "message")


def call(lease: Lease, message: bytes, countdown_seconds: float, gate: Gate) -> ScriptCall:
    """``retry.lua``'s call: the retry's ``message`` may start ``lease``'s ticket after the countdown."""
    n = KeyNames(lease.key)
    argv: dict[str, Any] = {
        "ticket": lease.ticket, "token": lease.token, "countdown_ms": seconds_to_ms(countdown_seconds),
        "dispatch_timeout_ms": gate.dispatch_timeout_ms, "message": message,
    }  # fmt: skip
    return ScriptCall("retry", [n.messages, n.holders, n.wires], [argv[name] for name in ARGV])


def parse(lease: Lease, reply: list[Any]) -> int | None:
    """The retry's dispatch, which its message must carry; None if the lease was fenced."""
    code, dispatch = reply
    logger.debug("retry key=%r ticket=%s code=%s dispatch=%s", lease.key, lease.ticket, Code(code).name, dispatch)
    return int(dispatch) if code == Code.OK else None
