"""Wait to start: how long a key's rate makes a granted ticket's message wait before a worker hands it to a
process, beside ``lua/wait_to_start.lua``. A check, not a claim: the start decides.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .calls import ScriptCall
from .keys import KeyNames
from .scripts import ms_to_seconds

if TYPE_CHECKING:
    from .gate import Gate

#: wait_to_start.lua's ARGV, in its header's order.
ARGV = ("ticket", "dispatch", "interval_ms", "lease_ms")


def call(key: str, ticket: int, dispatch: int, gate: Gate, *, interval_ms: int) -> ScriptCall:
    n = KeyNames(key)
    argv: dict[str, Any] = {
        "ticket": ticket, "dispatch": dispatch, "interval_ms": interval_ms, "lease_ms": gate.lease_ms
    }  # fmt: skip
    return ScriptCall("wait_to_start", [n.meta, n.holders, n.messages], [argv[name] for name in ARGV])


def parse(reply: list[Any]) -> tuple[float, bytes | None]:
    """Seconds to wait and the ticket's stored message; (0.0, None) when it may start now, or not at all."""
    wait, *message = reply
    return (ms_to_seconds(int(wait)), message[0]) if wait else (0.0, None)
