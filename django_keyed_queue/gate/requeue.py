"""Requeue: a running ticket's message goes back to the broker, beside ``lua/requeue.lua``.

The request is the run's ``Lease``; ``ARGV`` names the script's arguments in its header's order
(``tests/gate/test_scripts.py`` checks the two agree).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from .calls import ScriptCall, flag
from .keys import KeyNames
from .results import Lease
from .scripts import Code

if TYPE_CHECKING:
    from .gate import Gate

logger = logging.getLogger(__name__)

#: requeue.lua's ARGV, in its header's order.
ARGV = ("ticket", "token", "dispatch_timeout_ms", "unstarted")


def call(lease: Lease, unstarted: bool, gate: Gate) -> ScriptCall:
    """``requeue.lua``'s call; ``unstarted``: the attempt never ran, and is not counted."""
    argv: dict[str, Any] = {
        "ticket": lease.ticket, "token": lease.token, "dispatch_timeout_ms": gate.dispatch_timeout_ms,
        "unstarted": flag(unstarted),
    }  # fmt: skip
    return ScriptCall("requeue", [KeyNames(lease.key).holders], [argv[name] for name in ARGV])


def parse(lease: Lease, reply: list[Any]) -> bool:
    """True if the ticket was granted again with the same dispatch; False if the lease was fenced."""
    [code] = reply
    logger.debug("requeue key=%r ticket=%s code=%s", lease.key, lease.ticket, Code(code).name)
    return bool(code == Code.OK)
