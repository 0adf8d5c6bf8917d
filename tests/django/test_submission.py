"""Submission: rows, tickets and messages, and bad input that leaves nothing behind (G7)."""

import json

import pytest
import redis
from celery.app.task import Context
from django.test import override_settings
from kombu import Connection
from kombu.exceptions import OperationalError

from django_keyed_queue import GateUnavailable, InvalidArguments, InvalidKey, KeyQueueFull, keyed_serial_task
from django_keyed_queue.gate import MAX_KEY_LENGTH, Submission
from django_keyed_queue.gate.keys import KeyNames
from django_keyed_queue.gate.transport import ClusterTransport, ServerTransport
from django_keyed_queue.messaging.message import HEADER, JOIN_HEADER, TaskMessage
from django_keyed_queue.process.state import current
from django_keyed_queue.records.models import IdempotencyKey, KeyedTask
from django_keyed_queue.testing import write_submission_rows
from django_keyed_queue.worker.run_start import join
from testproject.demo.tasks import step, write_file
from tests.django.queues import QUEUE
from tests.gate_redis import redis_names

pytestmark = pytest.mark.django_db


def nothing_left(gate_redis, broker):
    assert KeyedTask.objects.count() == 0
    assert gate_redis.dbsize() == 0
    assert broker.llen(QUEUE) == 0


def test_free_key_is_dispatched_with_its_ticket(gate_redis, broker):
    result = step.apply_async(("a", 1), queue=QUEUE)
    assert not KeyedTask.objects.exists(), "the producer writes no row"
    assert write_submission_rows() == 1
    row = KeyedTask.objects.get(task_id=result.id)
    assert (row.key, row.ticket, row.status, row.task_name) == ("a", 1, "dispatched", step.name)
    assert row.dispatched_at is not None and "args=('a', 1)" in row.arguments
    message = json.loads(broker.lindex(QUEUE, 0))
    assert message["headers"]["id"] == result.id
    assert message["headers"][HEADER] == {"key": "a", "ticket": 1, "dispatch": 1}


def test_busy_key_parks_the_task_in_redis_not_the_broker(gate_redis, broker):
    first = step.apply_async(("a", 1), queue=QUEUE)
    second = step.apply_async(("a", 2), queue=QUEUE)
    write_submission_rows()
    rows = {r.task_id: r for r in KeyedTask.objects.all()}
    assert rows[second.id].status == "waiting" and rows[second.id].ticket == 2
    assert rows[first.id].status == "dispatched"
    assert broker.llen(QUEUE) == 1
    assert gate_redis.lrange(KeyNames("a").queue, 0, -1) == [b"2"]


def test_callable_key_over_the_task_arguments(gate_redis, broker):
    result = write_file.apply_async(("/srv/report.csv", "x"), queue=QUEUE)
    write_submission_rows()
    assert KeyedTask.objects.get(task_id=result.id).key == "/srv/report.csv"


def test_template_naming_a_missing_argument_fails_at_import():
    with pytest.raises(InvalidKey, match="'acount_id', which is not an argument"):

        @keyed_serial_task(key="account:{acount_id}")
        def sync(account_id):
            pass


def test_bad_limit_and_key_types_fail_at_import():
    with pytest.raises(ValueError, match="limit must be an int >= 1"):
        keyed_serial_task(key="{a}", limit=0)
    with pytest.raises(InvalidKey, match="format string or a callable"):
        keyed_serial_task(key=42)


@keyed_serial_task(key=lambda account_id: {"a": account_id}["b"], name="tests.raising_key")
def raising_key(account_id):
    pass


@keyed_serial_task(key=lambda account_id: account_id, name="tests.int_key")
def int_key(account_id):
    pass


@pytest.mark.parametrize(
    ("task", "args", "error", "match"),
    [
        (raising_key, (1,), InvalidKey, "cannot make the key"),
        (int_key, (1,), InvalidKey, "must be a str, got int"),
        (int_key, ("",), InvalidKey, "the key is empty"),
        (int_key, ("\ud800",), InvalidKey, "not valid text"),
        (int_key, ("x" * (MAX_KEY_LENGTH + 1),), InvalidKey, f"over the maximum of {MAX_KEY_LENGTH}"),
        (step, ("a",), InvalidArguments, "missing a required argument: 'n'"),
        (step, ("a", 1, 2, 3), InvalidArguments, "too many positional arguments"),
        (step, ("a", object()), InvalidArguments, "cannot be encoded with the 'json' serializer"),
    ],
)
def test_bad_input_fails_fast_and_leaves_nothing(task, args, error, match, gate_redis, broker):
    with pytest.raises(error, match=match):
        task.apply_async(args, queue=QUEUE)
    nothing_left(gate_redis, broker)


def test_bad_input_on_a_delayed_task_leaves_nothing(gate_redis, broker):
    with pytest.raises(InvalidArguments):
        step.apply_async(("a", object()), countdown=5, queue=QUEUE)
    nothing_left(gate_redis, broker)


def test_unreachable_redis_fails_fast_and_leaves_nothing(gate_redis, broker):
    with override_settings(KEYED_QUEUE_REDIS_URL="redis://127.0.0.1:1/0"):
        with pytest.raises(GateUnavailable, match="unreachable"):
            step.apply_async(("a", 1), queue=QUEUE)
    nothing_left(gate_redis, broker)


def lose_replies(monkeypatch, count: int) -> list:
    """The gate's next ``count`` calls run in Redis, then their connection breaks before the reply."""
    lost: list = []

    def reply_lost(real):
        def round_trip(transport, commands):
            replies = real(transport, commands)
            if len(lost) < count:
                lost.append(commands[0][0])
                raise redis.ConnectionError("the connection broke before the reply arrived")
            return replies

        return round_trip

    for transport in (ServerTransport, ClusterTransport):
        monkeypatch.setattr(transport, "round_trip", reply_lost(transport.round_trip))
    return lost


def test_a_submission_whose_reply_was_lost_keeps_the_one_ticket_it_took(gate_redis, broker, monkeypatch):
    behind = step.apply_async(("a", 0), queue=QUEUE)
    lost = lose_replies(monkeypatch, 1)
    result = step.apply_async(("a", 1), queue=QUEUE)
    assert lost == ["EVALSHA"], "the submit ran in Redis and its reply was lost"
    assert gate_redis.hget(KeyNames("a").meta, "seq") == b"2", "one ticket per submission"
    assert write_submission_rows() == 2, "one record per submission"
    row = KeyedTask.objects.get(task_id=result.id)
    assert (row.ticket, row.status) == (2, "waiting")
    assert [json.loads(m)["headers"]["id"] for m in broker.lrange(QUEUE, 0, -1)] == [behind.id]


def test_a_submission_that_never_gets_a_reply_says_it_may_still_run(gate_redis, broker, monkeypatch):
    current().gate.submit(Submission("another", b"m"))  # its script loaded: the lost calls run
    lose_replies(monkeypatch, 1_000)
    monkeypatch.setattr("django_keyed_queue.process.outage.SUBMIT_RETRY_SECONDS", 0.3)
    with pytest.raises(GateUnavailable, match="may have been queued and may still run"):
        step.apply_async(("a", 1), queue=QUEUE)
    assert KeyedTask.objects.count() == 0 and broker.llen(QUEUE) == 0
    assert gate_redis.hget(KeyNames("a").meta, "seq") == b"1", "the retries found the ticket and took no other"


def test_failed_publish_withdraws_the_ticket_and_the_row(gate_redis, broker):
    # A broker nobody listens on: the message is never sent, so the ticket must not stay held.
    with Connection("redis://127.0.0.1:1/1", connect_timeout=1) as dead:
        with pytest.raises(OperationalError):
            step.apply_async(("a", 1), queue=QUEUE, producer=dead.Producer(auto_declare=False), retry=False)
    assert write_submission_rows() == 0 and KeyedTask.objects.count() == 0
    assert broker.llen(QUEUE) == 0
    # Only the counters stay (idle, with the horizon's TTL): the number is not reused, since
    # the failed publish might have reached the broker after all. So does the task id's entry
    # in the index of recent submissions, which expires on its own.
    # (The deadline index may still name the key: the reaper drops it when it finds the key idle.)
    names = KeyNames("a")
    assert redis_names(gate_redis) == {names.meta, names.recent}
    assert gate_redis.pttl(names.meta) > 0 and 0 < gate_redis.pttl(names.recent) <= 60_000
    follower = step.apply_async(("a", 2), queue=QUEUE)
    write_submission_rows()
    assert KeyedTask.objects.get(task_id=follower.id).status == "dispatched"
    assert KeyedTask.objects.get(task_id=follower.id).ticket == 2


def test_delayed_task_is_recorded_waiting_without_a_ticket(gate_redis, broker):
    result = step.apply_async(("a", 1), countdown=60, queue=QUEUE)
    row = KeyedTask.objects.get(task_id=result.id)
    assert (row.status, row.ticket) == ("waiting", None)
    assert gate_redis.dbsize() == 0, "a delayed task joins its queue when due, not before"
    message = json.loads(broker.lindex(QUEUE, 0))
    assert HEADER not in message["headers"] and message["headers"]["eta"]


def test_eager_mode_runs_the_task_without_the_gate(gate_redis, settings):
    from testproject.celery import app

    app.conf.task_always_eager = True
    try:
        assert step.delay("eager", 7).get() == 7
    finally:
        app.conf.task_always_eager = False
    assert gate_redis.dbsize() == 0


def test_a_reused_task_id_is_another_submission_with_a_row_of_its_own(gate_redis, broker):
    """Celery reuses task ids on purpose (``replace``, a signature sent again): so may users."""
    step.apply_async(("a", 1), queue=QUEUE, task_id="same-id")
    step.apply_async(("a", 2), queue=QUEUE, task_id="same-id")
    write_submission_rows()
    rows = KeyedTask.objects.filter(task_id="same-id").order_by("ticket")
    assert [(r.ticket, r.status, r.arguments) for r in rows] == [
        (1, "dispatched", "args=('a', 1) kwargs={}"),
        (2, "waiting", "args=('a', 2) kwargs={}"),
    ]
    assert sorted(gate_redis.hkeys(KeyNames("a").messages)) == [b"1", b"2"]
    assert broker.llen(QUEUE) == 1


def test_an_idempotency_key_that_is_not_text_fails_and_writes_nothing(gate_redis, broker):
    with pytest.raises(InvalidArguments, match="idempotency_key '\\\\ud800' is not valid text"):
        step.apply_async(("a", 1), queue=QUEUE, idempotency_key="\ud800")
    nothing_left(gate_redis, broker)


def test_a_key_at_its_depth_limit_refuses_the_next_task_and_writes_nothing(gate_redis, broker, monkeypatch):
    with override_settings(KEYED_QUEUE_MAX_WAITING=2):
        accepted = [step.apply_async(("a", n), queue=QUEUE) for n in range(3)]  # one granted, two waiting
        before = gate_redis.hgetall(KeyNames("a").meta)
        with pytest.raises(KeyQueueFull, match=r"key 'a' has 2 tasks waiting, the most it may have \(max_waiting=2\)"):
            step.apply_async(("a", 3), queue=QUEUE, idempotency_key="full")
        assert gate_redis.hgetall(KeyNames("a").meta) == before, "no ticket taken"
        assert write_submission_rows() == 3 and KeyedTask.objects.count() == 3 and broker.llen(QUEUE) == 1
        assert not IdempotencyKey.objects.exists(), "the idempotency key was given back"
        step.apply_async(("b", 0), queue=QUEUE)
        write_submission_rows()
        assert KeyedTask.objects.filter(key="b").exists(), "other keys are not limited"
        monkeypatch.setattr(step, "max_waiting", 3)  # a task's own limit overrides the setting
        step.apply_async(("a", 3), queue=QUEUE)
    assert len(accepted) == 3 and gate_redis.llen(KeyNames("a").queue) == 3


@pytest.mark.parametrize("options", [{}, {"countdown": 60}, {"idempotency_key": "big"}])
def test_a_message_over_the_size_limit_is_refused_and_writes_nothing(gate_redis, broker, options):
    with override_settings(KEYED_QUEUE_MAX_MESSAGE_BYTES=3000):
        with pytest.raises(
            InvalidArguments, match=r"the task message is \d+ bytes, over KEYED_QUEUE_MAX_MESSAGE_BYTES \(3000\)"
        ):
            step.apply_async(("a", "x" * 3000), queue=QUEUE, **options)
        nothing_left(gate_redis, broker)
        assert not IdempotencyKey.objects.exists()
        step.apply_async(("a", "x" * 50), queue=QUEUE, **options)  # a smaller one fits


@pytest.mark.parametrize("sent_by", ["apply_async", "send_task"])
def test_a_delayed_task_that_waits_for_its_key_is_published_as_its_join(gate_redis, broker, sent_by):
    """When due it joins its key's queue; the message its grant publishes names the join, so that the
    run's record finds the submission's row, also when written before the join's own record. A
    message sent by name with ``send_task`` has no join id of its own: its task id is used."""
    step.apply_async(("k", 0), queue=QUEUE)  # holds the key
    delayed = step.apply_async(("k", 1), queue=QUEUE, countdown=60)
    [sent] = [json.loads(raw) for raw in broker.lrange(QUEUE, 0, -1) if json.loads(raw)["headers"]["id"] == delayed.id]
    if sent_by == "send_task":
        del sent["headers"][JOIN_HEADER]
    # What the worker does when the task is due, with the request its message gives.
    request = Context({**sent["headers"], "delivery_info": {"routing_key": QUEUE}})
    key, waiting = join(step, request, ("k", 1), {}, start=False, wait_out_outage=False)
    assert (key, waiting.granted) == ("k", False)
    stored = TaskMessage.decode(gate_redis.hget(KeyNames("k").messages, waiting.ticket), ["json"])
    assert stored.options["headers"][JOIN_HEADER] == sent["headers"].get(JOIN_HEADER, delayed.id)
    current().recorder.flush()  # here, in the test's transaction
    assert KeyedTask.objects.get(task_id=delayed.id).ticket == waiting.ticket
