"""Newer waiting: whether a newer submission of a coalescing task waits behind a run (what a running task's
``superseded()`` reads), beside ``lua/newer_waiting.lua``. Reads only.
"""

from __future__ import annotations

from typing import Any

from .calls import ScriptCall
from .keys import KeyNames

#: newer_waiting.lua's ARGV, in its header's order.
ARGV = ("task_name", "ticket")


def call(key: str, task_name: str, ticket: int) -> ScriptCall:
    n = KeyNames(key)
    argv: dict[str, Any] = {"task_name": task_name, "ticket": ticket}
    return ScriptCall("newer_waiting", [n.meta, n.messages, n.holders], [argv[name] for name in ARGV])


def parse(reply: Any) -> bool:
    return bool(reply)
