"""A keyed task's message is built by Celery's own ``send_task``, in the process that sends it, and goes to the gate.

Celery builds the message as for a plain task: routing, serializer, pydantic,
``argsrepr``, stamping, priorities, and the ``before_task_publish`` receivers
that add headers (tracing does) all shape it there, and the publish signals
and the ``task-sent`` event fire there. Where Celery hands the finished
message to its producer, ``GateProducer`` hands it to the gate instead: the
gate stores it with a ticket (its ``sent`` part), and it goes to the broker
now if its key is free, or later, exactly as built, when its turn comes
(``publish_stored``). The process that publishes it later builds nothing and
fires no publish signal: the message was sent, to the gate, by its caller.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured
from kombu import Queue
from kombu.serialization import registry  # type: ignore[attr-defined]  # kombu exports it; its stubs do not

from . import wire
from .message import TaskMessage, gate_message

if TYPE_CHECKING:
    from celery import Celery
    from celery.result import AsyncResult
    from kombu import Message, Producer

    from .task_type import KeyedTaskProtocol

#: What Celery passes to ``Producer.publish`` that says how to publish, not what; the rest but the
#: message's destination, headers and per-call timeouts are its properties.
PUBLISH_OPTIONS = ("serializer", "compression", "retry", "retry_policy", "delivery_mode")
#: Publish arguments that only make sense in the process that calls them.
LOCAL_PUBLISH_OPTIONS = ("timeout", "confirm_timeout")

#: Properties of a delivered message that Celery set when it published it (the rest are the transport's).
DELIVERED_PROPERTIES = ("correlation_id", "reply_to", "priority")


class SendNow:
    """The message Celery built, on its way to the broker: published now with a ticket's header
    (``send_now(header)``), or given to the gate as a template it pushes when it grants (``wire``)."""

    def __init__(self, app: Celery, message: TaskMessage, producer: Producer) -> None:
        self._app, self._message, self._producer = app, message, producer

    def __call__(self, header: dict[str, Any]) -> None:
        publish_stored(self._app, self._message, header, self._producer)

    def wire(self, key: str, gate_client: Any) -> bytes:
        return gate_wire(self._app, self._message, key, self._producer, gate_client)


#: What the gate does with a message Celery built: stores it, and may send it now with a ticket's header.
ToGate = Callable[[TaskMessage, SendNow], None]


class GateProducer:
    """The producer Celery's ``send_task`` is given: the message of ``task_id`` goes to ``to_gate``.

    Everything else Celery does with its producer (the ``task-sent`` event, the
    result backend's set-up) goes to the real one.
    """

    def __init__(self, producer: Producer, app: Celery, task_id: str, options: dict[str, Any], to_gate: ToGate) -> None:
        self._producer, self._app, self._task_id = producer, app, task_id
        self._options, self._to_gate = options, to_gate

    def __getattr__(self, name: str) -> Any:
        return getattr(self._producer, name)

    def publish(self, body: Any, **publish: Any) -> None:
        headers = publish.get("headers") or {}
        if headers.get("id") != self._task_id:
            if isinstance(body, dict) and body.get("id") == self._task_id:
                raise ImproperlyConfigured("keyed tasks need Celery's task message protocol 2 (task_protocol = 2)")
            return self._producer.publish(body, **publish)
        args, kwargs, embed = body
        publish = {name: value for name, value in publish.items() if name not in LOCAL_PUBLISH_OPTIONS}
        declare = publish.pop("declare", None) or ()
        exchange = publish.pop("exchange")
        sent = {
            "headers": publish.pop("headers"),
            "embed": embed,
            "exchange": getattr(exchange, "name", exchange) or "",
            "routing_key": publish.pop("routing_key") or "",
            "declare": [entity.name for entity in declare if isinstance(entity, Queue)],
            "publish": {name: publish.pop(name, None) for name in PUBLISH_OPTIONS},
            "properties": publish,
        }
        stored = gate_message(headers["task"], self._task_id, tuple(args), kwargs, self._options, sent)
        self._to_gate(stored, SendNow(self._app, stored, self._producer))


def send_to_gate(
    app: Celery,
    task: KeyedTaskProtocol | str,
    task_id: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    options: dict[str, Any],
    to_gate: ToGate,
) -> AsyncResult[Any]:
    """Celery's ``send_task`` of ``task`` (a task, or its name), its message given to ``to_gate``; its AsyncResult.

    ``to_gate`` runs where Celery would publish: what it raises, Celery's ``send_task``
    raises, before ``after_task_publish`` fires. ``options`` as ``message.send_options``
    gives them, or as a stored message holds them.
    """
    options = dict(options)
    producer = options.pop("producer", None) or options.pop("publisher", None)
    connection = options.pop("connection", None)
    if connection is not None:
        producer = app.amqp.Producer(connection, auto_declare=False)
    name = task if isinstance(task, str) else task.name
    typed: dict[str, Any] = {} if isinstance(task, str) else {"result_cls": task.AsyncResult, "task_type": task}
    with app.producer_or_acquire(producer) as real:
        # Celery takes any object with a producer's methods; its stubs say a kombu Producer.
        gated: Any = GateProducer(real, app, task_id, options, to_gate)
        return app.send_task(name, args, kwargs, task_id=task_id, producer=gated, **typed, **options)


def delivered(message: Message, headers: dict[str, Any]) -> dict[str, Any]:
    """The ``sent`` part of a delivered message (a kombu ``Message``), with ``headers`` as its headers.

    A delayed task joins its key's queue on the worker its message reached: what
    its caller's Celery built is published again as it came, with no eta-free copy
    built and no publish signal fired a second time.
    """
    headers = dict(headers)
    compression = headers.pop("compression", None)  # kombu's: it compresses again when told to
    properties = message.properties or {}
    routing = message.delivery_info or {}
    return {
        "headers": headers,
        "embed": message.payload[2],
        "exchange": routing.get("exchange") or "",
        "routing_key": routing.get("routing_key") or "",
        "declare": [routing["routing_key"]] if routing.get("routing_key") else [],
        "publish": {
            "serializer": registry.type_to_name.get(message.content_type),
            "compression": compression,
            "retry": None,
            "retry_policy": None,
            "delivery_mode": properties.get("delivery_mode"),
        },
        "properties": {name: properties[name] for name in DELIVERED_PROPERTIES if properties.get(name) is not None},
    }


def build(
    app: Celery,
    task: KeyedTaskProtocol | str,
    task_id: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    options: dict[str, Any],
) -> tuple[TaskMessage, AsyncResult[Any]]:
    """The message Celery builds for a call, sent nowhere (the publish signals fire), and its AsyncResult."""
    captured: list[TaskMessage] = []
    result = send_to_gate(app, task, task_id, args, kwargs, options, lambda message, send_now: captured.append(message))
    return captured[0], result


def with_celery_message(app: Celery, message: TaskMessage) -> TaskMessage:
    """``message`` with the message Celery builds for it (``sent``), built now if it was stored without it.

    Only a delayed task that joined its key's queue from its run (its worker's
    main process could not) stores its message without it: Celery builds it
    here, and the publish signals fire a second time, here.
    """
    if message.sent is not None:
        return message
    options = {**message.options, "add_to_parent": False}  # on the gate's behalf, not a child of this process's task
    return build(app, message.task_name, message.task_id, message.args, message.kwargs, options)[0]


def publish_stored(app: Celery, message: TaskMessage, header: dict[str, Any], producer: Producer | None = None) -> None:
    """Publish a stored message as Celery built it, with ``header`` (a ticket's) added; no signal fires.

    Every broker message of a keyed task that the gate granted goes out here: the producer's
    own submission granted at once, and every grant the dispatcher publishes later.
    """
    body, publish = publish_arguments(app, message, header)
    with app.producer_or_acquire(producer) as real:
        real.publish(body, **publish)


def gate_wire(app: Celery, message: TaskMessage, key: str, producer: Producer, gate_client: Any) -> bytes:
    """The template the gate pushes when it grants ``key``'s ticket of ``message`` (see ``wire``);
    empty where it cannot push it (its grant is published from here, ``publish_stored``)."""
    body, publish = publish_arguments(app, message, {})
    return wire.template(producer, gate_client, key, body, publish) or b""


def publish_arguments(app: Celery, message: TaskMessage, header: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """What kombu's ``Producer.publish`` is given for a stored message, with ``header`` added: body, arguments."""
    message = with_celery_message(app, message)
    sent = message.sent
    assert sent is not None
    publish = {**sent["properties"], **{name: value for name, value in sent["publish"].items() if value is not None}}
    return (list(message.args), message.kwargs, sent["embed"]), {
        **publish,
        "exchange": sent["exchange"],
        "routing_key": sent["routing_key"],
        "declare": _queues(app, sent["declare"]),
        "headers": {**sent["headers"], **header},
    }


def _queues(app: Celery, names: list[str]) -> list[Queue]:
    """The queues a message declares where it is published, as the app knows them (or would make them)."""
    queues = app.amqp.queues
    known = []
    for name in names:
        try:
            known.append(queues[name])
        except KeyError:  # task_create_missing_queues is off, and this process does not know the queue
            pass
    return known
