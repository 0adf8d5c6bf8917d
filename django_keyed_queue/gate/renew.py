"""Renew: extend the leases a worker process holds on one key, beside ``lua/renew.lua``.

The request is the ``Lease`` a run took at its start; ``ARGV`` names the script's arguments in its
header's order (``tests/gate/test_scripts.py`` checks the two agree).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .calls import ScriptCall
from .keys import KeyNames
from .results import Lease

if TYPE_CHECKING:
    from .gate import Gate

#: renew.lua's ARGV: the lease, then each lease of the key as a ticket, token pair.
ARGV = ("lease_ms", "leases")


def call(key: str, leases: Sequence[Lease], gate: Gate) -> ScriptCall:
    """``renew.lua``'s call for ``leases``, all of ``key``, by ``gate``'s lease."""
    pairs = [v for lease in leases for v in (lease.ticket, lease.token)]
    return ScriptCall("renew", [KeyNames(key).holders], [gate.lease_ms, *pairs])


def parse(leases: Sequence[Lease], reply: list[Any]) -> dict[Lease, bool]:
    """Each lease, and whether it was extended (False: fenced, or its run ended)."""
    return {lease: bool(ok) for lease, ok in zip(leases, reply, strict=True)}
