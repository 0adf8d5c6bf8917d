"""A keyed task's message as kombu's Redis transport puts it on a queue: a template the gate fills and pushes.

When the gate's Redis is the broker's (one server, one database: the README's
install), the script that grants a ticket also pushes its message onto
Celery's queue, in the same atomic call: a granted ticket is never left
without its message in the broker, whoever dies when. The producer prepares
the message here exactly as kombu's producer and Redis channel would publish
it (serialized, compressed, its body encoded, its delivery info, its
priority's list), leaving three holes the gate fills when it grants: the
ticket and dispatch of the ticket's header, and a part of the delivery tag
that makes each push's own. The route is the transport's too: a direct
exchange's bindings are looked up by the script when it pushes, as kombu
looks them up when it publishes (``common.lua``'s ``push_granted``).

Anything else keeps the two steps (grant, then publish from Python): another
Redis, a Redis Cluster, Sentinel, another broker, a fanout or topic exchange,
queues that expire (``x-expires``). ``describe`` says which one a process uses.
"""

from __future__ import annotations

import secrets
from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from weakref import WeakKeyDictionary

import redis
from kombu.serialization import dumps as serialize
from kombu.transport import redis as kombu_redis
from kombu.utils.json import dumps

from ..gate.pushes import username
from .message import HEADER

if TYPE_CHECKING:
    from kombu import Producer

#: The template's format, its first part (``push_granted`` pushes no other).
VERSION = "w1"
#: The holes' names, as ``push_granted`` fills them.
TICKET, DISPATCH, TAG = "t", "d", "g"


def same_server(gate_client: Any, connection: Any) -> bool:
    """Whether kombu's ``connection`` is to the gate's own Redis server and database (told from their
    settings: nothing connects here)."""
    if type(connection.transport) is not kombu_redis.Transport or type(gate_client) is not redis.Redis:
        return False  # Sentinel, another broker, a Redis Cluster: two steps
    gate = gate_client.connection_pool.connection_kwargs
    vhost = str(connection.virtual_host or "").strip("/") or "0"
    if not vhost.isdigit() or gate.get("path"):
        return False
    broker = (connection.hostname, connection.port or kombu_redis.DEFAULT_PORT, int(vhost))
    return broker == (gate.get("host"), gate.get("port"), gate.get("db"))


def same_user(gate_client: Any, connection: Any) -> bool:
    """Whether the gate connects as the Redis user kombu's ``connection`` connects as (no name:
    Redis' ``default``)."""
    return (username(gate_client) or "default") == (connection.userid or "default")


def describe(gate_client: Any, connection: Any) -> str:
    """How grants reach the broker from a process whose broker connection is kombu's ``connection``,
    for the log line a worker writes when it starts: only what it knows it does.

    As two Redis users, the gate pushes only where its user's ACL lets it write the broker's
    queues: the first push refused is logged at WARNING (``gate/pushes.py``), and from then on
    each refused one is published in a second step.
    """
    if same_server(gate_client, connection) and same_user(gate_client, connection):
        return (
            "the gate pushes each granted task's message onto Celery's queue in the same atomic call "
            "(its Redis is the broker's)"
        )
    if same_server(gate_client, connection):
        return (
            f"the gate's Redis is the broker's, as another Redis user ({username(gate_client) or 'default'!r}, "
            f"the broker's {connection.userid or 'default'!r}): the gate pushes a granted task's message onto "
            "Celery's queue in the same call only if that user's ACL lets it, and a refused push is published "
            "in a second step and logged once (see docs/deployment.md)"
        )
    return (
        "granted tasks' messages are published in two steps, the grant and then the publish: the gate's "
        "Redis is not the broker's (one server and database, kombu's Redis transport; see docs/guarantees.md)"
    )


def template(producer: Producer, gate_client: Any, key: str, body: Any, publish: dict[str, Any]) -> bytes | None:
    """The template ``push_granted`` fills for a message Celery publishes with ``producer.publish(body,
    **publish)``, if the gate can push it; else None (its grant is published from Python)."""
    if not same_server(gate_client, producer.connection):
        return None
    channel = producer.channel
    declare = publish.get("declare") or ()
    if type(channel) is not kombu_redis.Channel or getattr(channel, "_expires", None):
        return None  # kombu 5.7's expiring queues are touched by its own publish
    if any(getattr(queue, "expires", None) for queue in declare):
        return None
    exchange = publish.get("exchange") or ""
    exchange = getattr(exchange, "name", exchange) or ""
    if exchange and _exchange_type(channel, exchange, declare) != "direct":
        return None
    shape_of = _shape_key(producer, exchange, publish)
    if shape_of is None:
        return _built(producer, channel, exchange, key, body, publish)
    shapes = _shapes.setdefault(channel, {})
    if shape_of not in shapes:
        if len(shapes) >= MAX_SHAPES:
            shapes.clear()
        shapes[shape_of] = Shape.of(producer, channel, exchange, body, publish)
    shape = shapes[shape_of]
    if shape is None:
        return _built(producer, channel, exchange, key, body, publish)
    return shape.fill(channel, key, body, publish)


def _built(
    producer: Producer, channel: Any, exchange: str, key: str, body: Any, publish: dict[str, Any]
) -> bytes | None:
    """The template, built whole through kombu's producer with the holes in place of their values."""
    holes = {name: f"keyed-hole-{secrets.token_hex(16)}" for name in (TICKET, DISPATCH, TAG)}
    captured = _prepare(producer, channel, body, {
        **publish, "headers": {**(publish.get("headers") or {}), HEADER: {
            "key": key, "ticket": holes[TICKET], "dispatch": holes[DISPATCH],
        }},
    })  # fmt: skip
    if captured is None:
        return None
    message, routing_key = captured
    message["properties"]["delivery_tag"] = f"{message['properties']['delivery_tag']}.{holes[TAG]}"
    pieces = _split(dumps(message), {f'"{holes[TICKET]}"': TICKET, f'"{holes[DISPATCH]}"': DISPATCH, holes[TAG]: TAG})
    if pieces is None:
        return None
    route = _route(channel, exchange, routing_key, message)
    return None if route is None else "\0".join([*route, *pieces]).encode()


def _route(channel: Any, exchange: str, routing_key: str, message: dict[str, Any]) -> list[str] | None:
    """The template's first parts: where ``push_granted`` pushes the message; None if one holds a NUL."""
    prefix = channel.global_keyprefix or ""
    binding = prefix + channel.keyprefix_queue % exchange if exchange else ""
    # The list kombu's _put picks for the message's priority (the same private calls it makes).
    suffix = channel._q_for_pri("", channel._get_message_priority(message, reverse=False))
    route = [VERSION, binding, routing_key, prefix, suffix, channel.sep]
    return None if any("\0" in part for part in route) else route


#: The message's parts filled per message; the rest of it is its shape's, alike for every message of one.
BODY, HEADERS, CORRELATION, DELIVERY = "body", "headers", "correlation_id", "delivery_tag"
#: A channel's shapes kept, at most: a process's tasks, queues and priorities (beyond them, built again).
MAX_SHAPES = 256
#: Each kombu channel's message shapes, by ``_shape_key``: a message's template is built through kombu's
#: producer once per shape, then filled here for each message (its body, headers, id and delivery tag).
_shapes: WeakKeyDictionary[Any, dict[Hashable, Shape | None]] = WeakKeyDictionary()


def _shape_key(producer: Producer, exchange: str, publish: dict[str, Any]) -> Hashable | None:
    """What makes two messages' templates alike but for their body, headers and id; None for a message
    whose template is built whole (compressed, already serialized, expiring, or with an option that cannot
    be compared)."""
    if publish.get("compression") or producer.compression or publish.get("content_type"):
        return None
    if publish.get("expiration") is not None:  # a task's ``expires`` as a time: each message its own
        return None
    if not isinstance(publish.get("headers") or {}, dict):
        return None
    alike = [(name, value) for name, value in publish.items() if name not in PER_MESSAGE]
    declared = tuple(getattr(queue, "name", queue) for queue in publish.get("declare") or ())
    shape = (
        exchange, producer.serializer, declared, "correlation_id" in publish,
        tuple(sorted(alike, key=lambda item: item[0])),
    )  # fmt: skip
    try:
        hash(shape)
    except TypeError:
        return None
    return shape


#: Publish arguments that differ from message to message, or that do not shape the message pushed.
PER_MESSAGE = frozenset({"headers", "correlation_id", "exchange", "declare", "retry", "retry_policy"})


@dataclass(frozen=True)
class Shape:
    """A message's template but for its body, headers, correlation id and delivery tag: the JSON kombu's
    producer made around them, cut where they go (``parts``, text and part names), and its route."""

    route: list[str]
    parts: list[str]
    serializer: str | None

    @classmethod
    def of(cls, producer: Producer, channel: Any, exchange: str, body: Any, publish: dict[str, Any]) -> Shape | None:
        holes = {name: f"keyed-hole-{secrets.token_hex(16)}" for name in (BODY, HEADERS, CORRELATION, DELIVERY)}
        captured = _prepare(producer, channel, body, publish)
        if captured is None:
            return None
        message, routing_key = captured
        properties = message["properties"]
        if "correlation_id" not in properties:
            return None
        message[BODY], message[HEADERS] = holes[BODY], holes[HEADERS]
        properties["correlation_id"], properties["delivery_tag"] = holes[CORRELATION], holes[DELIVERY]
        parts = _split(dumps(message), {f'"{hole}"': name for name, hole in holes.items()})
        route = _route(channel, exchange, routing_key, message)
        if parts is None or route is None or parts[1::2] != [BODY, HEADERS, CORRELATION, DELIVERY]:
            return None
        return cls(route, parts, publish.get("serializer") or producer.serializer)

    def fill(self, channel: Any, key: str, body: Any, publish: dict[str, Any]) -> bytes:
        """The template of one message of this shape: kombu's serializer and body encoding, as its producer."""
        _, _, serialized = serialize(body, serializer=self.serializer)
        encoded, _ = channel.encode_body(serialized, channel.body_encoding)
        headers = {name: value for name, value in (publish.get("headers") or {}).items() if name != HEADER}
        before = dumps(headers)[:-1] + (", " if headers else "")
        ours = f'"{HEADER}": {{"key": {dumps(key)}, "ticket": '
        tag = f'"{channel._next_delivery_tag()}.'
        a, _, b, _, c, _, d, _, e = self.parts
        pieces = [
            f"{a}{dumps(encoded)}{b}{before}{ours}", TICKET, ', "dispatch": ', DISPATCH,
            f"}}}}{c}{dumps(publish['correlation_id'])}{d}{tag}", TAG, f'"{e}',
        ]  # fmt: skip
        return "\0".join([*self.route, *pieces]).encode()


def _exchange_type(channel: Any, exchange: str, declare: Any) -> str:
    """The type of ``exchange`` as kombu's channel would find it: declared here, or by a queue; else direct."""
    declared = channel.state.exchanges.get(exchange)
    if declared is not None:
        return str(declared.get("type") or "direct")
    for entity in declare:
        bound: Any = getattr(entity, "exchange", None)
        if getattr(bound, "name", None) == exchange:
            return str(bound.type or "direct")
    return "direct"


class _Capture:
    """A channel that keeps what kombu's producer would publish instead of publishing it."""

    def __init__(self, channel: Any) -> None:
        self._channel = channel
        self.published: tuple[dict[str, Any], str] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._channel, name)

    def basic_publish(self, message: dict[str, Any], exchange: str, routing_key: str, **_: Any) -> None:
        self._channel._inplace_augment_message(message, exchange, routing_key)
        self.published = (message, routing_key)


def _prepare(producer: Producer, channel: Any, body: Any, publish: dict[str, Any]) -> tuple[dict[str, Any], str] | None:
    """The message dict kombu's producer and channel would push for ``publish``, and its routing key."""
    from kombu import Producer

    capture = _Capture(channel)
    publish = {**publish, "declare": None, "retry": False, "retry_policy": None}
    Producer(capture, exchange=producer.exchange, auto_declare=False).publish(body, **publish)  # type: ignore[arg-type]
    return capture.published


def _split(payload: str, holes: dict[str, str]) -> list[str] | None:
    """``payload`` cut at each hole (each found once): piece, hole name, piece, ...; None if one is not."""
    found = []
    for text, name in holes.items():
        at = payload.find(text)
        if at < 0 or payload.find(text, at + 1) >= 0:
            return None
        found.append((at, text, name))
    pieces, start = [], 0
    for at, text, name in sorted(found):
        pieces += [payload[start:at], name]
        start = at + len(text)
    return [*pieces, payload[start:]]
