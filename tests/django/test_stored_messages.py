"""Stored messages are decoded only in the formats the app accepts (``accept_content``), never as pickle."""

import base64
import json
import pickle

import pytest
from celery import current_app

from django_keyed_queue.exceptions import ActionRefused, MessageRefused
from django_keyed_queue.gate.keys import KeyNames
from django_keyed_queue.messaging.message import TaskMessage
from django_keyed_queue.ops.actions import recovery
from django_keyed_queue.process.state import get_gate
from django_keyed_queue.records.models import KeyedTask
from django_keyed_queue.testing import write_submission_rows
from testproject.demo.tasks import step
from tests.django.queues import QUEUE

pytestmark = pytest.mark.django_db


class Payload:
    """Unpickling it creates a file: proof that something decoded it."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def pickled_envelope(task_id: str, path) -> bytes:
    body = pickle.dumps({"args": [], "kwargs": {}, "options": {}, "x": Payload(str(path))})
    return json.dumps(
        {
            "task": step.name,
            "id": task_id,
            "content_type": "application/x-python-serialize",
            "encoding": "binary",
            "body": base64.b64encode(body).decode(),
        }
    ).encode()


def test_a_pickled_message_is_refused_without_decoding_it(tmp_path):
    with pytest.raises(MessageRefused, match="'application/x-python-serialize' is not in accept_content"):
        TaskMessage.decode(pickled_envelope("t-1", tmp_path / "ran"), ["json"])
    assert not (tmp_path / "ran").exists()
    with pytest.raises(MessageRefused, match="malformed"):
        TaskMessage.decode(b"[1, 2]", ["json"])
    for content_type in (["application/json"], {"a": 1}, None, 3):
        hostile = json.dumps({"task": step.name, "id": "t-2", "content_type": content_type, "body": ""}).encode()
        with pytest.raises(MessageRefused, match="is not in accept_content"):
            TaskMessage.decode(hostile, ["json"])


def test_a_parked_message_rewritten_as_pickle_fails_its_task_and_the_key_moves_on(gate_redis, broker, tmp_path):
    recovery.pause("k")
    first, second = (step.apply_async(("k", n), queue=QUEUE) for n in (1, 2))
    gate_redis.hset(KeyNames("k").messages, 1, pickled_envelope(first.id, tmp_path / "ran"))

    done = recovery.resume("k")
    assert (done.published, done.broker_refused, done.message_refused) == (1, 0, 1)
    assert not (tmp_path / "ran").exists(), "the payload was never unpickled"
    row = KeyedTask.objects.get(task_id=first.id)
    assert row.status == "failed" and "not in accept_content" in row.error
    assert [json.loads(m)["headers"]["id"] for m in broker.lrange(QUEUE, 0, -1)] == [second.id]
    assert list(get_gate().inspect("k").holders) == [2]


def test_the_admin_s_retry_refuses_a_failed_row_whose_message_is_pickle(gate_redis, broker, tmp_path):
    task = step.apply_async(("k", 1), queue=QUEUE)
    write_submission_rows()
    KeyedTask.objects.filter(task_id=task.id).update(
        status="failed", message=pickled_envelope(task.id, tmp_path / "ran").decode()
    )
    with pytest.raises(ActionRefused, match="not in accept_content"):
        recovery.retry(task.id, app=current_app)
    assert not (tmp_path / "ran").exists()


def test_a_parked_message_that_is_not_even_json_fails_its_task_by_its_ticket(gate_redis, broker, admin_client):
    recovery.pause("k")
    first, second = (step.apply_async(("k", n), queue=QUEUE) for n in (1, 2))
    write_submission_rows()
    gate_redis.hset(KeyNames("k").messages, 1, b"\x00not json")

    done = recovery.resume("k")
    assert (done.published, done.message_refused) == (1, 1)
    row = KeyedTask.objects.get(task_id=first.id)
    assert row.status == "failed" and "its envelope is malformed" in row.error
    assert [json.loads(m)["headers"]["id"] for m in broker.lrange(QUEUE, 0, -1)] == [second.id]
    with pytest.raises(ActionRefused, match=" failed: only a waiting or dispatched task"):
        recovery.cancel(first.id)
    health = admin_client.get("/keyed-queue/health/").json()
    assert health["queue_depth"] == 0, health
