"""A push Redis refuses (``common.lua``'s ``push_granted``, ``gate/pushes.py``): the grant stands, its caller
publishes it (``pushed`` is False), and the process says why once per cause, at WARNING.

The gate connects as a Redis ACL user of its own, on the tier's server; the template is one
``messaging/wire.py`` would make for the default exchange (the routing key is the queue), with no holes.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator

import pytest
import redis

from django_keyed_queue.gate import Finish, Gate, Start, Submission
from tests.gate.conftest import GATE_SETTINGS
from tests.gate_redis import ON_CLUSTER

pytestmark = pytest.mark.skipif(ON_CLUSTER, reason="the gate pushes only on a single server")

QUEUE = "acl-test-queue"
#: "w1", the binding ('' = the default exchange), routing key, key prefix, priority suffix, separator, then the
#: message: one piece, no hole.
TEMPLATE = b"\0".join([b"w1", b"", QUEUE.encode(), b"", b"", b"\x06\x16", b'{"body": "m"}'])
PUSHES_LOGGER = "django_keyed_queue.gate.pushes"


@pytest.fixture
def gate_as(redis_url, gate_redis) -> Iterator:
    """A gate connecting as a new ACL user with ``rules``; the user and the test's queue removed after."""
    made: list[tuple[str, Gate]] = []

    def make(*rules: str) -> Gate:
        user = f"keyed-queue-test-{uuid.uuid4().hex[:8]}"
        gate_redis.acl_setuser(user, enabled=True, passwords=["+secret"], keys=["keyed_queue:*"], commands=["+@all"])
        if rules:
            gate_redis.execute_command("ACL", "SETUSER", user, *rules)
        scheme, rest = redis_url.split("://", 1)
        gate = Gate(redis.Redis.from_url(f"{scheme}://{user}:secret@{rest}"), **GATE_SETTINGS)
        made.append((user, gate))
        return gate

    yield make
    for user, gate in made:
        gate.client.close()
        gate_redis.acl_deluser(user)
    gate_redis.delete(QUEUE)


def refusals(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == PUSHES_LOGGER and r.levelno == logging.WARNING]


def test_a_push_the_gates_user_may_not_make_is_left_to_its_caller_and_told_once(gate_as, gate_redis, caplog):
    gate = gate_as()  # the gate's keys only: not the broker's queue

    with caplog.at_level(logging.WARNING, logger=PUSHES_LOGGER):
        first = gate.submit(Submission("k1", b"m", wire=TEMPLATE))
        second = gate.submit(Submission("k2", b"m", wire=TEMPLATE))

    assert first is not None and second is not None
    assert (first.granted, first.pushed, second.granted, second.pushed) == (True, False, True, False)
    assert gate_redis.llen(QUEUE) == 0
    assert gate.inspect("k1").holders[1].state == "granted", "the grant stands: its caller publishes it"
    (told,) = refusals(caplog)
    assert "an ACL refusal (NOPERM; LPUSH 'acl-test-queue': " in told
    assert f"ACL SETUSER {gate.pushes.username} %W~acl-test-queue* %R~_kombu.binding.*" in told
    assert "one Redis user" in told


def test_the_rule_the_warning_names_lets_the_gate_push(gate_as, gate_redis, caplog):
    gate = gate_as(f"%W~{QUEUE}*", "%R~_kombu.binding.*")

    with caplog.at_level(logging.WARNING, logger=PUSHES_LOGGER):
        submitted = gate.submit(Submission("k", b"m", wire=TEMPLATE))

    assert submitted is not None and submitted.granted and submitted.pushed
    assert gate_redis.rpop(QUEUE) == b'{"body": "m"}'
    assert refusals(caplog) == []


def test_a_push_refused_for_another_cause_is_told_once_too(gate_as, gate_redis, caplog):
    gate = gate_as("~*")
    gate_redis.set(QUEUE, "not a list")  # each push meets WRONGTYPE

    with caplog.at_level(logging.WARNING, logger=PUSHES_LOGGER):
        first = gate.submit(Submission("k", b"m1", wire=TEMPLATE))
        gate.submit(Submission("k", b"m2", wire=TEMPLATE))
        finished = gate.finish(Finish("k", 1, gate.start(Start("k", 1, 1)).token))

    assert first is not None and first.granted and not first.pushed
    assert [(g.ticket, g.pushed) for g in finished.granted] == [(2, False)], "a finish's grant: its caller publishes it"
    (told,) = refusals(caplog)
    assert "LPUSH 'acl-test-queue': WRONGTYPE" in told and "ACL" not in told
