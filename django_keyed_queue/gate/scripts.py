"""Load the Lua scripts shipped in ``lua/`` and name what they return."""

from __future__ import annotations

import enum
import re
from importlib import resources

_INCLUDE = re.compile(r'^--- @include "([a-z_]+)"$', re.MULTILINE)
SCRIPT_NAMES = (
    *("submit", "start", "finish", "retry", "requeue", "renew"),
    *("cancel", "refuse_join", "reap", "reindex", "rebuild", "stage_rebuild", "restore_ahead"),
    *("pause", "stop", "run_now"),
    "republish_soon",
    *("claim_unwritten", "unwritten", "unblock", "wait_to_start", "newer_waiting", "override"),
    "replacement",
    *("pool_acquire", "pool_release", "pool_renew", "pool_wait", "pool_granted", "pool_override"),
)


class Code(enum.IntEnum):
    """First element of every script's reply."""

    OK = 0
    PARKED = 1
    NOT_GRANTED = 2
    ALREADY_STARTED = 3
    STALE_DISPATCH = 4
    STALE_TOKEN = 5
    RUNNING = 6
    DUPLICATE = 7
    EXISTS = 8
    FOREIGN_MESSAGE = 9
    QUEUE_FULL = 10
    BLOCKED = 11
    TOO_EARLY = 12
    NOT_PAUSED = 13
    ALREADY_PAUSED = 14


def _read(path: str) -> str:
    return resources.files(__package__).joinpath("lua", path).read_text(encoding="utf-8")


def _assemble(name: str) -> str:
    return _INCLUDE.sub(lambda m: _read(f"includes/{m.group(1)}.lua"), _read(f"{name}.lua"))


# Read once, at import. Read later, in a thread of a worker's main process, a script would take
# importlib's lock on this package; a child process forked meanwhile inherits that lock held, and
# hangs on its first gate call.
_SOURCES = {name: _assemble(name) for name in SCRIPT_NAMES}


def source(name: str) -> str:
    """The script ``name`` with its ``--- @include`` lines replaced by the included files."""
    return _SOURCES[name]


def seconds_to_ms(seconds: float) -> int:
    return max(0, round(seconds * 1000))


def ms_to_seconds(ms: int) -> float:
    return ms / 1000.0
