"""Reap: one key's visit by the reaper (or an operator's release), beside ``lua/reap.lua``.

A ``Reap`` is built by the reaper's pass, ``republish_unstarted`` or ``release`` and passed unchanged to
the call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .base import stored_text
from .calls import ScriptCall, flag, or_empty
from .keys import KeyNames
from .results import Recovery, RecoveryAction, Stopping

if TYPE_CHECKING:
    from .gate import Gate


@dataclass(frozen=True)
class Reap:
    """Recover ``key``'s holders whose deadline passed."""

    key: str
    #: Report what would be done and change nothing.
    dry_run: bool = False
    #: A ticket to recover now whatever its deadline (an operator's release); with ``released_dispatch``, only
    #: that dispatch of it, and with ``released_unstarted`` only if it was granted and has not started.
    release: int | None = None
    released_dispatch: int | None = None
    released_unstarted: bool = False
    #: Server ms: publish again also every granted ticket whose dispatch deadline is before then.
    republish_before: int | None = None


#: reap.lua's ARGV, in its header's order.
ARGV = (
    "dispatch_timeout_ms", "idle_horizon_ms", "dry_run", "outcome_grace_ms", "release", "republish_before",
    "released_dispatch", "released_unstarted",
)  # fmt: skip


def call(reap: Reap, gate: Gate) -> ScriptCall:
    r = reap
    argv: dict[str, Any] = {
        "dispatch_timeout_ms": gate.dispatch_timeout_ms, "idle_horizon_ms": gate.idle_horizon_ms,
        "dry_run": flag(r.dry_run), "outcome_grace_ms": gate.outcome_grace_ms, "release": or_empty(r.release),
        "republish_before": or_empty(r.republish_before), "released_dispatch": or_empty(r.released_dispatch),
        "released_unstarted": flag(r.released_unstarted),
    }  # fmt: skip
    n = KeyNames(r.key)
    keys = [n.meta, n.queue, n.messages, n.holders, n.outcomes, n.scan_cursors, n.wires]
    return ScriptCall("reap", keys, [argv[name] for name in ARGV])


def parse(key: str, reply: list[Any], pushed: Callable[[Any], bool]) -> tuple[int, list[Recovery]]:
    """The key's next deadline (server ms; -1: none), and its recoveries (``pushed``: the gate's
    ``pushes.pushed``, which reads that field)."""
    flat = reply[1:]
    recoveries = [
        Recovery(
            key,
            RecoveryAction(flat[i].decode()),
            int(flat[i + 1]),
            int(flat[i + 2]),
            int(flat[i + 3]),
            flat[i + 4],
            pushed=pushed(flat[i + 5]),
            stopped=_stopped(flat[i + 6]),
        )  # fmt: skip
        for i in range(0, len(flat), 7)
    ]
    return int(reply[0]), recoveries


def _stopped(note: bytes | str) -> Stopping | None:
    """A stopped run's note in the reply: since|how|by, or empty."""
    if not note:
        return None
    since_ms, how, by = stored_text(note).split("|", 2)
    return Stopping(by, int(since_ms), how)
