"""One call of a Lua script as the gate's runner sends it, and the encoding of its arguments.

A script's arguments are positional on the wire. Each script's builder names them once, in its
header's order: a transition's module beside its script (``submit.py`` beside ``lua/submit.lua``)
in its ``ARGV``; the module of the concern that sends each of the others (``pools.py``, ``unwritten.py``,
``reaping.py``, ``base.py``) in the keyword arguments of its ``<script>_call``. ``tests/gate/test_scripts.py``
checks each against its header. Change a header and its builder together. Builders only build: the
gate's runner (``Gate._pipelined``) sends what they return.

On the wire a yes/no is 1 or 0, and an absent value is ''; ``flag`` and ``or_empty`` make that encoding,
so that a caller passes ``bool`` and ``None``.
"""

from __future__ import annotations

from typing import NamedTuple

from redis.typing import EncodableT


class ScriptCall(NamedTuple):
    """One call of the script ``script`` (a name in ``scripts.SCRIPT_NAMES``)."""

    script: str
    keys: list[str]
    args: list[EncodableT]


def flag(value: bool) -> int:
    """A yes/no as a script takes it: 1 or 0."""
    return 1 if value else 0


def or_empty(value: int | None) -> int | str:
    """An absent value as a script takes it: ''."""
    return "" if value is None else value
