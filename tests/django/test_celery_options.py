"""Celery's task options that change what a submission checks or records: ``typing=False``,
``argsrepr`` / ``kwargsrepr``."""

import base64
import json

import pytest
from celery import Task
from django.test import override_settings
from django.utils import timezone

from django_keyed_queue import InvalidArguments, InvalidKey, keyed_serial_task
from django_keyed_queue.records.models import KeyedTask
from django_keyed_queue.records.transitions import Transition
from django_keyed_queue.testing import write_submission_rows
from testproject.demo.tasks import step
from tests.django.queues import QUEUE

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("gate_redis")]


@keyed_serial_task(key="loose:{account}", typing=False, name="tests.loose")
def loose(account, amount):
    return amount


@keyed_serial_task(key="strict:{account}", name="tests.strict")
def strict(account, amount):
    return amount


def test_typing_false_sends_a_call_with_missing_arguments_as_celery_does(broker):
    """Celery skips the argument check of a ``typing=False`` task (it fails in the worker); so do we."""
    with pytest.raises(InvalidArguments, match="missing a required argument: 'amount'"):
        strict.apply_async(("a",), queue=QUEUE)
    result = loose.apply_async(("a",), queue=QUEUE)
    assert json.loads(broker.lindex(QUEUE, 0))["headers"]["id"] == result.id
    write_submission_rows()
    assert KeyedTask.objects.get(task_id=result.id).key == "loose:a"


def test_typing_false_still_needs_the_arguments_its_key_names(broker):
    with pytest.raises(InvalidKey, match="cannot make the key"):
        loose.apply_async((), {"amount": 3}, queue=QUEUE)
    assert broker.llen(QUEUE) == 0 and not KeyedTask.objects.exists()


def test_the_record_shows_the_arguments_as_the_caller_asked_celery_to_show_them(broker):
    result = step.apply_async(("k", 1, 0), argsrepr="('k', '<hidden>')", kwargsrepr="{}", queue=QUEUE)
    write_submission_rows()
    assert KeyedTask.objects.get(task_id=result.id).arguments == "args=('k', '<hidden>') kwargs={}"
    assert json.loads(broker.lindex(QUEUE, 0))["headers"]["argsrepr"] == "('k', '<hidden>')"


def test_the_redaction_hook_wins_over_argsrepr(broker):
    with override_settings(KEYED_QUEUE_REDACT_ARGUMENTS=lambda name, args, kwargs: (("***",), {})):
        result = step.apply_async(("k", 1, 0), argsrepr="('k', 1, 0)", queue=QUEUE)
    write_submission_rows()
    assert KeyedTask.objects.get(task_id=result.id).arguments == "args=('***',) kwargs={}"


def test_a_row_a_worker_creates_shows_the_messages_argsrepr():
    create = {
        "task_name": "demo.step", "enqueued_at": timezone.now(), "args": ("k", "4111 1111"), "kwargs": {},
        "argsrepr": "('k', '<card>')", "kwargsrepr": None,
    }  # fmt: skip
    KeyedTask.objects.apply(Transition("t-1", "k", 1, "running", 1, {}, create))
    assert KeyedTask.objects.get(task_id="t-1").arguments == "args=('k', '<card>') kwargs={}"


pydantic = pytest.importorskip("pydantic")


class Order(pydantic.BaseModel):
    account: str
    cents: int


@keyed_serial_task(key="order:{order[account]}", pydantic=True, name="tests.charge")
def charge(order: Order) -> int:
    return order.cents


@pytest.mark.skipif(
    not hasattr(Task, "_dump_pydantic_arguments"), reason="this Celery does not dump models at the call (5.7+ does)"
)
def test_a_pydantic_task_sends_its_models_as_celery_does(broker):
    """``pydantic=True``: Celery dumps the models to dicts at the call; the key is made from what is sent."""
    result = charge.apply_async((Order(account="a-1", cents=250),), queue=QUEUE)
    sent = json.loads(broker.lindex(QUEUE, 0))
    assert sent["headers"]["id"] == result.id
    args, kwargs, _ = json.loads(base64.b64decode(sent["body"]))
    assert args == [{"account": "a-1", "cents": 250}]
    write_submission_rows()
    assert KeyedTask.objects.get(task_id=result.id).key == "order:a-1"
