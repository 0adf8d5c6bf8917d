"""keys.py: reversible escaping, one cluster slot per logical key, no shared Redis names."""

from __future__ import annotations

import itertools

import pytest
from redis.crc import key_slot

from django_keyed_queue.gate import Finish, Lease, Submission
from django_keyed_queue.gate.keys import PREFIX, KeyNames, escape, key_from_redis_name, unescape
from tests.gate_redis import redis_names

TRICKY_KEYS = [
    "account:42",
    "{",
    "}",
    "{}",
    "}{",
    "a{b}c",
    "{tag}",
    "%",
    "%7B",
    "%7D",
    "%25",
    "%%7B}",
    "100% {done}",
    "with space",
    "  leading and trailing  ",
    "ünïcødé ✓ 键 🔑",
    "tab\there",
    "new\nline",
    "nul\x00byte",
    ":meta",
    "x}:meta",
    "keyed_queue:{k}:meta",
    "a" * 200,
]


def _names(key: str) -> list[str]:
    names = KeyNames(key)
    return [names.meta, names.queue, names.messages, names.holders, names.joined, names.wires]


@pytest.mark.parametrize("key", TRICKY_KEYS)
def test_escaping_round_trips(key):
    escaped = escape(key)
    assert "{" not in escaped and "}" not in escaped
    assert unescape(escaped) == key


@pytest.mark.parametrize("key", TRICKY_KEYS)
def test_every_name_maps_back_to_its_key(key):
    for name in _names(key):
        assert name.startswith(f"{PREFIX}:{{")
        assert key_from_redis_name(name) == key


def test_escaping_is_reversible_for_every_short_string():
    """Exhaustive over an alphabet made of the escape characters and what follows them."""
    alphabet = "%{}72BD5 é"
    seen: dict[str, str] = {}
    for length in range(5):
        for chars in itertools.product(alphabet, repeat=length):
            key = "".join(chars)
            escaped = escape(key)
            assert unescape(escaped) == key, key
            assert "{" not in escaped and "}" not in escaped, key
            assert seen.setdefault(escaped, key) == key, f"{key!r} and {seen[escaped]!r} escape alike"


@pytest.mark.parametrize("key", TRICKY_KEYS)
def test_all_names_of_a_key_hash_to_one_slot(key):
    slots = {key_slot(name.encode()) for name in _names(key)}
    assert slots == {key_slot(escape(key).encode())}, "the hash tag must be exactly the escaped key"


def test_names_of_one_key_are_distinct():
    for key in TRICKY_KEYS:
        assert len(set(_names(key))) == 6
    assert KeyNames("k").all() == [
        KeyNames("k").meta,
        KeyNames("k").queue,
        KeyNames("k").messages,
        KeyNames("k").holders,
        KeyNames("k").wires,
    ]


def test_different_keys_share_no_redis_name_and_spread_over_slots():
    keys = TRICKY_KEYS + [f"account:{i}" for i in range(500)]
    owner: dict[str, str] = {}
    for key in keys:
        for name in _names(key):
            assert owner.setdefault(name, key) == key, f"{key!r} and {owner[name]!r} share {name}"
    slots = {key_slot(KeyNames(key).meta.encode()) for key in keys}
    assert len(slots) > len(keys) * 0.9, "different keys must hash to (mostly) different slots"


def test_keys_that_look_alike_escaped_are_separate_queues(gate, gate_redis):
    """'a{b' escapes to 'a%7Bb', which must not be the same queue as the literal key 'a%7Bb'."""
    lookalikes = ["a{b", "a%7Bb", "a%257Bb", "a}b", "a%7Db"]
    results = {key: gate.submit(Submission(key, key.encode(), start=True)) for key in lookalikes}

    assert all(r.granted and r.ticket == 1 and r.token > 0 for r in results.values())
    names = redis_names(gate_redis)
    assert len(names) == 3 * len(lookalikes)  # meta, messages and holders of each
    assert {key_from_redis_name(name) for name in names} == set(lookalikes)
    for key, result in results.items():
        assert gate.finish(Finish(key, result.ticket, result.token)).ok


@pytest.mark.parametrize("key", TRICKY_KEYS)
def test_the_gate_works_on_tricky_keys_in_one_slot(gate, gate_redis, key):
    first = gate.submit(Submission(key, b"m1", start=True, join_id="j1"))
    gate.submit(Submission(key, b"m2"))
    assert list(gate.renew([Lease(key, first.ticket, first.token)]).values()) == [True]

    names = redis_names(gate_redis)
    assert {key_from_redis_name(name) for name in names} == {key}
    assert len({key_slot(name.encode()) for name in names}) == 1
    (grant,) = gate.finish(Finish(key, first.ticket, first.token)).granted
    assert (grant.key, grant.ticket, grant.message) == (key, 2, b"m2")
    state = gate.inspect(key)
    assert state.key == key and list(state.holders) == [2]


def test_a_key_redis_cannot_carry_fails_before_anything_is_written(gate, gate_redis):
    with pytest.raises(ValueError):  # a lone surrogate has no UTF-8 encoding
        gate.submit(Submission("half \ud800 pair", b"m"))
    assert redis_names(gate_redis) == set()


def test_the_empty_key_is_refused():
    # Its hash tag would be "{}", which Redis Cluster ignores: its names would hash to different slots.
    with pytest.raises(ValueError, match="must not be empty"):
        _names("")
