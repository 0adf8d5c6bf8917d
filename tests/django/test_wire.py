"""The gate pushes a granted ticket's message as kombu's Redis transport would publish it (``messaging/wire.py``).

Each test publishes the same stored message both ways, the gate's push and
kombu's own publish, on the same connection, and compares what lands on the
broker's lists: everything but the delivery tag (each push's own) must match.
"""

import json
import uuid

import pytest
import redis
from django.conf import settings as django_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kombu import Connection, Exchange, Queue

from django_keyed_queue.gate import Cancel, Finish, Gate, Start, Submission
from django_keyed_queue.gate.keys import KeyNames
from django_keyed_queue.messaging import wire
from django_keyed_queue.messaging.building import build, publish_arguments
from django_keyed_queue.messaging.message import ticket_header
from testproject.demo.tasks import step
from tests.django.queues import QUEUE

pytestmark = pytest.mark.skipif(
    django_settings.CELERY_BROKER_URL.startswith("sentinel"), reason="the broker is a single Redis server here"
)


@pytest.fixture
def on_broker(broker):
    """A gate on the broker's own Redis database, as the README's install has it; its keys removed after."""
    gate = Gate(redis.Redis.from_url(django_settings.CELERY_BROKER_URL))
    yield gate
    for name in broker.keys("keyed_queue:*"):
        broker.delete(name)
    gate.client.close()


def _message(**options):
    message, _ = build(step.app, step, str(uuid.uuid4()), ("a", 1), {}, {"queue": QUEUE, **options})
    return message


def _template(connection, gate, key, message):
    """The template of ``message``, filled from its shape as a producer's second message of it is."""
    body, publish = publish_arguments(step.app, message, {})
    wire.template(connection.Producer(), gate.client, key, body, publish)  # its shape kept, if it can be
    return wire.template(connection.Producer(), gate.client, key, body, publish)


def _pushed_and_published(broker, connection, gate, key, message, list_name=QUEUE):
    """The gate's push of ``message`` on a free key, then kombu's publish of it: both payloads, decoded."""
    submitted = gate.submit(Submission(key, b"{}", wire=_template(connection, gate, key, message)))
    assert submitted is not None and submitted.granted and submitted.pushed
    pushed = broker.rpop(list_name)
    body, publish = publish_arguments(step.app, message, ticket_header(key, submitted.ticket, 1))
    connection.Producer().publish(body, **publish)
    published = broker.rpop(list_name)
    assert pushed is not None and published is not None, "each lands on the same list"
    return json.loads(pushed), json.loads(published)


def _same_but_the_tag(pushed, published):
    tag, kombu_tag = pushed["properties"].pop("delivery_tag"), published["properties"].pop("delivery_tag")
    assert tag != kombu_tag and isinstance(tag, str)
    assert pushed == published


def test_a_grant_at_submission_pushes_the_message_kombu_would_publish(broker, on_broker):
    with Connection(django_settings.CELERY_BROKER_URL) as connection:
        pushed, published = _pushed_and_published(broker, connection, on_broker, "k", _message())
    assert pushed["headers"]["keyed_queue"] == {"key": "k", "ticket": 1, "dispatch": 1}
    _same_but_the_tag(pushed, published)


def test_a_priority_goes_to_the_list_kombu_picks_for_it(broker, on_broker):
    # kombu's Redis transport keeps a list per priority step: 5 falls in step 3's.
    with Connection(django_settings.CELERY_BROKER_URL) as connection:
        step_list = QUEUE + "\x06\x163"
        try:
            pushed, published = _pushed_and_published(
                broker, connection, on_broker, "k", _message(priority=5), step_list
            )
        finally:
            broker.delete(step_list)
    _same_but_the_tag(pushed, published)


def test_the_transport_s_key_prefix_and_separator_are_honoured(broker, on_broker):
    options = {"global_keyprefix": "site1:", "sep": ":", "priority_steps": [0, 5]}
    with Connection(django_settings.CELERY_BROKER_URL, transport_options=options) as connection:
        exchange = Exchange("tasks", type="direct")
        queue = Queue(QUEUE, exchange, routing_key="to-q")
        queue(connection.default_channel).declare()  # the binding, under the prefix
        try:
            message = _message(exchange="tasks", routing_key="to-q", priority=7)
            pushed, published = _pushed_and_published(broker, connection, on_broker, "k", message, f"site1:{QUEUE}:5")
        finally:
            broker.delete(f"site1:{QUEUE}:5", "site1:_kombu.binding.tasks")
    _same_but_the_tag(pushed, published)


def test_a_finish_pushes_the_next_ticket_with_its_own_header(broker, on_broker):
    with Connection(django_settings.CELERY_BROKER_URL) as connection:
        first, second = _message(), _message()
        on_broker.submit(Submission("k", b"{}", wire=_template(connection, on_broker, "k", first)))
        parked = on_broker.submit(Submission("k", b"{}", wire=_template(connection, on_broker, "k", second)))
        assert parked is not None and not parked.granted and broker.llen(QUEUE) == 1
        broker.delete(QUEUE)
        started = on_broker.start(Start("k", 1, 1))
        finished = on_broker.finish(Finish("k", 1, started.token))
    assert [(g.ticket, g.pushed) for g in finished.granted] == [(2, True)]
    [raw] = broker.lrange(QUEUE, 0, -1)
    pushed = json.loads(raw)
    assert pushed["headers"]["id"] == second.task_id
    assert pushed["headers"]["keyed_queue"] == {"key": "k", "ticket": 2, "dispatch": 1}
    assert not on_broker.client.hexists(KeyNames("k").wires, 1), "a finished ticket's template is dropped"


def test_a_finish_that_keeps_the_next_grant_pushes_nothing_for_it(broker, on_broker):
    with Connection(django_settings.CELERY_BROKER_URL) as connection:
        for _ in range(2):
            on_broker.submit(Submission("k", b"{}", wire=_template(connection, on_broker, "k", _message())))
        broker.delete(QUEUE)
        started = on_broker.start(Start("k", 1, 1))
        finished = on_broker.finish(Finish("k", 1, started.token, keep_first_seconds=5))
    assert [(g.ticket, g.pushed) for g in finished.granted] == [(2, False)]
    assert broker.llen(QUEUE) == 0
    assert on_broker.inspect("k").holders[2].deadline_in <= 5, "the reaper publishes it if its keeper dies"


def test_other_set_ups_keep_the_two_steps(broker, on_broker, redis_server):
    message = _message()
    body, publish = publish_arguments(step.app, message, {})
    with Connection(django_settings.CELERY_BROKER_URL) as connection:
        other_db = redis.Redis.from_url(f"{redis_server.url}/9")
        assert wire.template(connection.Producer(), other_db, "k", body, publish) is None
        other_db.close()
        fanout = {**publish, "exchange": "fan", "declare": [Queue("q", Exchange("fan", type="fanout"))]}
        assert wire.template(connection.Producer(), on_broker.client, "k", body, fanout) is None
        expiring = {**publish, "declare": [Queue(QUEUE, expires=60)]}
        assert wire.template(connection.Producer(), on_broker.client, "k", body, expiring) is None
    submitted = on_broker.submit(Submission("k", b"{}", wire=b""))
    assert submitted is not None and submitted.granted and not submitted.pushed and broker.llen(QUEUE) == 0


def test_a_direct_exchange_with_no_queue_bound_is_left_to_the_caller(broker, on_broker):
    with Connection(django_settings.CELERY_BROKER_URL) as connection:
        template = _template(connection, on_broker, "k", _message(exchange="unbound", routing_key="nowhere"))
        assert template is not None
        submitted = on_broker.submit(Submission("k", b"{}", wire=template))
    assert submitted is not None and submitted.granted and not submitted.pushed


@pytest.mark.parametrize("options", [{"compression": "zlib"}, {"expires": 30}], ids=["compressed", "expiring"])
def test_a_message_of_no_shape_is_built_whole_as_kombu_publishes_it(broker, on_broker, options):
    with Connection(django_settings.CELERY_BROKER_URL) as connection:
        pushed, published = _pushed_and_published(broker, connection, on_broker, "k", _message(**options))
        assert not any(wire._shapes.get(connection.default_channel, {}).values()), "no shape kept"
    assert "compression" in pushed["headers"] if "compression" in options else pushed["properties"]["expiration"]
    _same_but_the_tag(pushed, published)


def test_messages_of_one_shape_each_push_their_own_body_headers_and_id(broker, on_broker):
    with Connection(django_settings.CELERY_BROKER_URL) as connection:
        messages = [_message(), _message(headers={"tenant": "t1"}), _message()]
        pairs = [_pushed_and_published(broker, connection, on_broker, f"k{n}", m) for n, m in enumerate(messages)]
        [shape] = wire._shapes[connection.default_channel].values()
        assert shape is not None, "built through kombu once, then filled"
    for n, (message, (pushed, published)) in enumerate(zip(messages, pairs, strict=True)):
        assert pushed["headers"]["id"] == pushed["properties"]["correlation_id"] == message.task_id
        assert pushed["headers"]["keyed_queue"]["key"] == f"k{n}"
        _same_but_the_tag(pushed, published)
    assert pairs[1][0]["headers"]["tenant"] == "t1" and "tenant" not in pairs[2][0]["headers"]


#: Keys and arguments as users and attackers send them: unicode, quotes and backslashes (escaped in
#: the JSON the holes sit in), NUL, huge, and text that looks like a hole.
ODD_TEXT = st.one_of(
    st.text(st.characters(codec="utf-8"), max_size=40),
    st.text(alphabet='"\\\x00é{}%\x06\x16:', max_size=12),
    st.just("keyed-hole-" + "0" * 32),
    st.just("x" * 5000),
)


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(
    key=ODD_TEXT.filter(bool), argument=ODD_TEXT, priority=st.sampled_from([None, 0, 4, 9]),
    task_id=st.one_of(st.uuids().map(str), ODD_TEXT.filter(bool)), header=ODD_TEXT,
)  # fmt: skip
def test_any_key_and_arguments_are_pushed_as_kombu_would_publish_them(
    broker, on_broker, key, argument, priority, task_id, header
):
    options = {"queue": QUEUE, "priority": priority, "headers": {"odd": header}}
    message, _ = build(step.app, step, task_id, (argument, 1), {}, options)
    lists = [QUEUE, *(f"{QUEUE}\x06\x16{n}" for n in (3, 6, 9))]
    broker.delete(*lists)  # other tests' priorities may have left messages on them
    with Connection(django_settings.CELERY_BROKER_URL) as connection:
        template = _template(connection, on_broker, key, message)
        submitted = on_broker.submit(Submission(key, b"{}", wire=template))
        assert submitted is not None and submitted.pushed
        pushed = next(raw for raw in (broker.rpop(name) for name in lists) if raw is not None)
        body, publish = publish_arguments(step.app, message, ticket_header(key, submitted.ticket, 1))
        connection.Producer().publish(body, **publish)
        published = next(raw for raw in (broker.rpop(name) for name in lists) if raw is not None)
    on_broker.cancel(Cancel(key, submitted.ticket))
    _same_but_the_tag(json.loads(pushed), json.loads(published))
