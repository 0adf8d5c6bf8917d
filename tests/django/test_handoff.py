"""Which granted tasks a finishing worker may run itself (local handoff), and the request it gives them."""

import pytest
from celery import current_app

from django_keyed_queue.gate import Grant
from django_keyed_queue.messaging.message import HEADER, TaskMessage
from django_keyed_queue.process.state import WorkerTraits
from django_keyed_queue.worker.handoff import local_request
from testproject.demo.tasks import step, timed_step


def request_for(task_name: str, options: dict | None = None):
    message = TaskMessage(task_name, "task-1", ("k", 3), {}, options or {})
    return local_request(current_app, message, Grant("k", 7, 2, b""), "w1@host", WorkerTraits())


@pytest.fixture
def worker_reads_celery_only():
    queues = current_app.amqp.queues
    before = queues._consume_from
    queues.select(["celery"])
    yield
    queues._consume_from = before


def test_a_plain_grant_gets_the_request_its_message_would_carry(worker_reads_celery_only):
    request = request_for(step.name, {"priority": 3, "headers": {"tenant": "a"}})
    assert request[HEADER] == {"key": "k", "ticket": 7, "dispatch": 2}
    assert (request["id"], request["task"], request["args"], request["kwargs"]) == ("task-1", step.name, ["k", 3], {})
    assert request["delivery_info"] == {
        "exchange": "",  # Celery publishes to a direct exchange's queue by name, with the default exchange
        "routing_key": "celery",
        "priority": 3,
        "redelivered": False,
    }
    assert request["hostname"] == "w1@host" and request["tenant"] == "a" and request["is_eager"] is False
    assert request["root_id"] == "task-1" and request["retries"] == 0


def test_links_are_kept_as_the_request_callbacks(worker_reads_celery_only):
    link = step.si("other", 1)
    request = request_for(step.name, {"link": dict(link)})
    assert request["callbacks"] == [dict(link)]


@pytest.mark.parametrize(
    "options",
    [{"expires": 30}, {"chain": []}, {"group_id": "g"}, {"time_limit": 5}, {"soft_time_limit": 5}, {"shadow": "x"}],
)
def test_options_only_the_worker_honours_send_it_by_broker(worker_reads_celery_only, options):
    assert request_for(step.name, options) is None


def test_a_task_with_a_time_limit_goes_by_broker(worker_reads_celery_only):
    assert request_for(timed_step.name) is None
    current_app.conf.task_soft_time_limit = 10
    try:
        assert request_for(step.name) is None
    finally:
        current_app.conf.task_soft_time_limit = None


def test_a_queue_this_worker_does_not_read_goes_by_broker(worker_reads_celery_only):
    assert request_for(step.name, {"queue": "elsewhere"}) is None
    assert request_for(step.name, {"queue": "celery"}) is not None


def test_an_unregistered_task_goes_by_broker(worker_reads_celery_only):
    assert request_for("somewhere.else.task") is None
