"""apply_async_many: many calls, one gate round trip per batch, every guarantee of one submission."""

import json

import pytest
from kombu import Connection
from kombu.exceptions import OperationalError

from django_keyed_queue import InvalidArguments, InvalidKey, KeyQueueFull
from django_keyed_queue.gate import Gate
from django_keyed_queue.gate.keys import KeyNames
from django_keyed_queue.gate.transport import ClusterTransport, ServerTransport
from django_keyed_queue.messaging.message import HEADER
from django_keyed_queue.records.models import IdempotencyKey, KeyedTask
from django_keyed_queue.testing import write_submission_rows
from testproject.demo.tasks import charge, step
from tests.django.queues import QUEUE

pytestmark = pytest.mark.django_db


@pytest.fixture
def round_trips(monkeypatch):
    """How many round trips the gate makes (each call passed through to Redis)."""
    count = []

    def counted(real):
        def round_trip(transport, commands):
            count.append(len(commands))
            return real(transport, commands)

        return round_trip

    for transport in (ServerTransport, ClusterTransport):
        monkeypatch.setattr(transport, "round_trip", counted(transport.round_trip))
    return count


def published(broker) -> list[tuple[str, int]]:
    """(key, ticket) of each message on the test queue, oldest first."""
    headers = [json.loads(raw)["headers"][HEADER] for raw in reversed(broker.lrange(QUEUE, 0, -1))]
    return [(h["key"], h["ticket"]) for h in headers]


def test_calls_take_their_tickets_in_list_order_one_round_trip_per_batch(gate_redis, broker, round_trips):
    calls = [(f"k{i % 3}", i) for i in range(10)] + [{"key": "k0", "n": 10}]
    step.apply_async(("warm", 0), queue=QUEUE)  # Redis has the script now
    broker.delete(QUEUE)
    round_trips.clear()

    results = step.apply_async_many(calls, queue=QUEUE, batch_size=4)

    assert len(round_trips) == 3, "11 calls in batches of 4"
    assert sorted(published(broker)) == [("k0", 1), ("k1", 1), ("k2", 1)]
    assert write_submission_rows() == 12
    rows = {r.task_id: r for r in KeyedTask.objects.all()}
    assert [(rows[r.id].key, rows[r.id].arguments) for r in results[:2]] == [
        ("k0", "args=('k0', 0) kwargs={}"), ("k1", "args=('k1', 1) kwargs={}"),
    ]  # fmt: skip
    for key in ("k0", "k1", "k2"):
        in_list_order = [rows[r.id].ticket for r in results if rows[r.id].key == key]
        assert in_list_order == list(range(1, len(in_list_order) + 1))
    assert rows[results[-1].id].arguments == "args=() kwargs={'key': 'k0', 'n': 10}"


@pytest.mark.parametrize(
    ("bad", "error", "match"),
    [
        (("k",), InvalidArguments, "missing a required argument: 'n'"),
        ({"key": "", "n": 1}, InvalidKey, "empty"),
        ("k", InvalidArguments, "a tuple of positional arguments or a dict of keyword arguments, got str"),
        (("k", "x" * 2_000_000), InvalidArguments, "over KEYED_QUEUE_MAX_MESSAGE_BYTES"),
    ],
)
def test_a_bad_call_anywhere_fails_the_whole_call_and_writes_nothing(gate_redis, broker, bad, error, match):
    calls = [("a", 1), ("b", 2), bad, ("c", 3)]
    with pytest.raises(error, match=match):
        step.apply_async_many(calls, queue=QUEUE, batch_size=2)
    assert gate_redis.dbsize() == 0 and broker.llen(QUEUE) == 0
    assert write_submission_rows() == 0 and not KeyedTask.objects.exists()


def test_idempotent_calls_return_their_originals_within_the_list_and_after_it(gate_redis, broker):
    before = charge.delay(1, "5.00")
    results = charge.apply_async_many([(1, "5.00"), (2, "7.00"), (2, "7.00")], queue=QUEUE)
    assert [r.id for r in results] == [before.id, results[1].id, results[1].id]
    assert write_submission_rows() == 2 and KeyedTask.objects.count() == 2


def test_an_explicit_idempotency_key_reused_in_the_list_returns_the_first(gate_redis, broker):
    results = step.apply_async_many([("a", 1), ("a", 1), ("b", 1)], idempotency_keys=["x", "x", None], queue=QUEUE)
    assert results[1].id == results[0].id and results[2].id != results[0].id
    assert write_submission_rows() == 2
    assert IdempotencyKey.objects.get().task_id == results[0].id


def test_idempotency_keys_must_match_the_calls(gate_redis, broker):
    with pytest.raises(InvalidArguments, match="2 idempotency keys for 3 calls"):
        step.apply_async_many([("a", 1)] * 3, idempotency_keys=["x", "y"], queue=QUEUE)
    assert gate_redis.dbsize() == 0


def test_a_full_key_stops_the_list_there_and_withdraws_the_rest(gate_redis, broker, monkeypatch):
    monkeypatch.setattr(step, "max_waiting", 1)
    calls = [("a", 1), ("b", 1), ("a", 2), ("a", 3), ("c", 1)]
    with pytest.raises(KeyQueueFull, match="key 'a' has 1 tasks waiting") as raised:
        step.apply_async_many(calls, queue=QUEUE)
    assert "the first 3 calls of the bulk submission were submitted" in str(raised.value.__notes__)
    assert write_submission_rows() == 3
    assert sorted((r.key, r.ticket) for r in KeyedTask.objects.all()) == [("a", 1), ("a", 2), ("b", 1)]
    assert gate_redis.exists(KeyNames("c").meta) == 0, "c's ticket, never published, was given back"


def test_a_broker_failure_withdraws_what_was_not_published(gate_redis, broker):
    step.apply_async(("a", 0), queue=QUEUE)  # a is busy: its calls below park
    with Connection("redis://127.0.0.1:1/1", connect_timeout=1) as dead:
        with pytest.raises(OperationalError) as raised:
            step.apply_async_many(
                [("a", 1), ("b", 1), ("a", 2)], queue=QUEUE, producer=dead.Producer(auto_declare=False), retry=False
            )
    assert "the first 1 calls of the bulk submission were submitted" in str(raised.value.__notes__)
    assert write_submission_rows() == 2
    assert sorted((r.key, r.ticket, r.status) for r in KeyedTask.objects.all()) == [
        ("a", 1, "dispatched"), ("a", 2, "waiting"),
    ]  # fmt: skip
    assert Gate(gate_redis).inspect("a").last_ticket == 2, "the withdrawn a-2 gave its ticket back"
    assert Gate(gate_redis).inspect("a").waiting == [2]
    assert Gate(gate_redis).inspect("b").holders == {}
