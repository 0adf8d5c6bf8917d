"""The dispatcher publishes a granted ticket by task name, with the options stored at submission."""

import json
import time

import pytest
from celery import current_app

from django_keyed_queue import keyed_serial_task
from django_keyed_queue.gate import Grant
from django_keyed_queue.gate.keys import KeyNames
from django_keyed_queue.messaging.dispatch import Published, publish
from django_keyed_queue.messaging.message import ENQUEUED_HEADER, HEADER, TaskMessage
from django_keyed_queue.process.state import get_gate
from testproject.demo.tasks import step
from tests.django.queues import QUEUE

pytestmark = pytest.mark.django_db


def test_a_grant_is_published_by_name_in_a_process_without_its_task(gate_redis, broker):
    message = TaskMessage("shop.tasks.not_imported_here", "t-1", ("k", 1), {"full": True}, {"queue": QUEUE})
    assert message.task_name not in current_app.tasks
    grant = Grant("k", 3, 2, message.encode("json"))

    assert publish(current_app, grant) is Published.SENT
    sent = json.loads(broker.lindex(QUEUE, 0))
    assert (sent["headers"]["task"], sent["headers"]["id"]) == ("shop.tasks.not_imported_here", "t-1")
    assert sent["headers"][HEADER] == {"key": "k", "ticket": 3, "dispatch": 2}


def test_the_stored_message_carries_the_task_s_own_options(gate_redis, broker):
    @keyed_serial_task(key="{key}", time_limit=60, soft_time_limit=30, name="tests.routed_step")
    def routed_step(key, n):
        return n

    step.apply_async(("r", 0), queue=QUEUE)  # holds the key: the next one is parked with its message
    routed_step.apply_async(("r", 1), queue=QUEUE, headers={"tenant": "acme"})
    stored = TaskMessage.decode(gate_redis.hget(KeyNames("r").messages, 2), ["json"])
    submitted_at = stored.options["headers"].pop(ENQUEUED_HEADER)  # the metrics' wait is measured from it
    assert abs(submitted_at - time.time()) < 60
    assert {name: stored.options.get(name) for name in ("queue", "headers", "time_limit", "soft_time_limit")} == {
        "queue": QUEUE,
        "headers": {"tenant": "acme"},
        "time_limit": 60,
        "soft_time_limit": 30,
    }

    publish(current_app, Grant("r", 2, 1, gate_redis.hget(KeyNames("r").messages, 2)))
    sent = json.loads(broker.lindex(QUEUE, 0))
    assert sent["headers"]["task"] == "tests.routed_step" and sent["headers"]["timelimit"] == [60, 30]
    assert sent["headers"]["tenant"] == "acme"
    assert get_gate().inspect("r").waiting == [2]
