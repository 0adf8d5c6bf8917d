"""scripts.py and the Lua headers: includes resolved, documented codes and arguments match the code."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest

import django_keyed_queue.gate as gate_package
from django_keyed_queue.gate import Cancel, Code, Finish, Lease, Start, Submission
from django_keyed_queue.gate.scripts import SCRIPT_NAMES, _read, ms_to_seconds, seconds_to_ms, source


def _transition(name: str):
    """The module of its own beside script ``name`` (``gate/<name>.py``, naming its ``ARGV``), or None."""
    try:
        module = importlib.import_module(f"django_keyed_queue.gate.{name}")
    except ModuleNotFoundError:
        return None
    return module if hasattr(module, "ARGV") else None


def _builders(name: str) -> list[tuple[str, object]]:
    """Each module of the gate with a builder of script ``name`` not in a module of its own, and that builder."""
    found = []
    for path in sorted(Path(gate_package.__file__).parent.glob("*.py")):
        module = importlib.import_module(f"django_keyed_queue.gate.{path.stem}")
        for builder in (getattr(module, f"{name}_call", None), getattr(module, f"{name}_calls", None)):
            if inspect.isfunction(builder) and builder.__module__ == module.__name__:  # its own, not imported
                found.append((path.stem, builder))
    return found


#: Scripts that read a key's state and change nothing.
READS_ONLY = ("newer_waiting", "replacement")

#: The scripts of pools that run in a key's slot (the others run in the pool's).
KEY_SIDE_OF_POOLS = ("pool_wait", "pool_granted")


def _header_and_body(name: str) -> tuple[str, str]:
    text = _read(f"{name}.lua")
    assert text.startswith("--[["), f"{name}.lua must open with its header block"
    header, body = text.split("]]", 1)
    return header, body


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_includes_are_resolved(name):
    text = source(name)
    assert "@include" not in text
    if name.startswith("pool_") and name not in KEY_SIDE_OF_POOLS:
        assert "local function pool_now_ms()" in text, "every script of a pool includes pool.lua"
    elif name not in ("reindex", "unwritten", *READS_ONLY):  # over an index, or reads only
        assert "local function now_ms()" in text, "every script of a key includes common.lua"
    assert source(name) is text, "sources are assembled once"


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_documented_return_codes_are_the_ones_returned(name):
    header, body = _header_and_body(name)
    documented = {int(n): label for n, label in re.findall(r"^\s*code (\d+) ([A-Z_]+)", header, re.MULTILINE)}
    returned = {int(n) for n in re.findall(r"return \{(\d+)", body)}
    no_code = (
        "renew",
        "reap",
        "reindex",
        "claim_unwritten",
        "unwritten",
        "wait_to_start",
        "pool_release",
        "pool_renew",
        "pool_override",
    )
    if name in (*no_code, *READS_ONLY):
        assert not documented and not returned, f"{name} returns no code"
        return
    assert set(documented) == returned | {0}, f"{name}: documented {documented}, returned {returned}"
    assert all(Code(n).name == label for n, label in documented.items())


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_every_key_and_argument_used_is_documented(name):
    header, body = _header_and_body(name)
    for kind in ("KEYS", "ARGV"):
        declared = {int(n) for n in re.findall(rf"{kind}\[(\d+)\]", header)}
        used = {int(n) for n in re.findall(rf"{kind}\[(\d+)\]", body)}
        assert used <= declared, f"{name}.lua uses {kind} {sorted(used - declared)} without documenting them"
        assert declared == set(range(1, len(declared) + 1)), f"{name}.lua: {kind} must be numbered from 1"


def test_seconds_and_milliseconds():
    assert seconds_to_ms(30) == 30_000
    assert seconds_to_ms(0.2) == 200
    assert seconds_to_ms(0.0004) == 0
    assert seconds_to_ms(-5) == 0
    assert ms_to_seconds(1500) == 1.5


def test_the_gate_survives_a_flushed_script_cache(gate, gate_redis):
    """After a Redis restart the server has no scripts: every call must load its script again."""
    first = gate.submit(Submission("k", b"m1"))
    gate_redis.script_flush()
    started = gate.start(Start("k", first.ticket, 1))
    assert started.ok
    gate_redis.script_flush()
    lease = Lease("k", first.ticket, started.token)
    assert gate.renew([lease]) == {lease: True}, "renew runs in a pipeline: it must load scripts too"
    gate_redis.script_flush()
    gate.submit(Submission("k", b"m2"))
    gate_redis.script_flush()
    dispatch = gate.retry(Lease("k", first.ticket, started.token), b"m1", countdown_seconds=0)
    gate_redis.script_flush()
    restarted = gate.start(Start("k", first.ticket, dispatch))
    gate_redis.script_flush()
    assert gate.finish(Finish("k", first.ticket, restarted.token)).granted[0].ticket == 2
    gate_redis.script_flush()
    assert gate.cancel(Cancel("k", 2)).ok


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_each_script_s_builder_takes_its_header_s_arguments_in_order(name):
    """A script's builder names its header's ARGV, in the header's order: its module's ``ARGV``, or the keyword
    arguments of ``<script>_call`` (``reindex_calls``) in the one module of the gate that holds it."""
    header, _ = _header_and_body(name)
    # "ARGV[3] dispatch_timeout_ms", or the repeated tail: "ARGV[2], ARGV[3], ...  leases: ticket, token pairs".
    documented = re.findall(r"^\s*ARGV\[\d+\](?:, ARGV\[\d+\])*(?:, \.\.\.)?\s+(\w+)", header, re.MULTILINE)
    transition = _transition(name)
    if transition is not None:  # a transition's module beside its script names its ARGV
        assert list(transition.ARGV) == documented, f"gate/{name}.py's ARGV; {name}.lua documents {documented}"
        return
    builders = _builders(name)
    assert len(builders) == 1, f"{name}.lua: one builder, in one module of the gate, not {builders}"
    [(home, builder)] = builders
    taken = [p.name for p in inspect.signature(builder).parameters.values() if p.kind is p.KEYWORD_ONLY]
    assert taken == documented, f"{home}.{builder.__name__} takes {taken}; {name}.lua documents {documented}"
