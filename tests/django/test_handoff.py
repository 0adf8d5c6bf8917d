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


class StartingWorker:
    """What ``WorkerTraits.of`` reads of Celery's ``WorkController`` at ``worker_init``, with the real app."""

    app = current_app
    task_events = True

    def __init__(self, time_limit=None, soft_time_limit=None):
        self.time_limit, self.soft_time_limit = time_limit, soft_time_limit


def test_a_worker_notes_its_accept_content_and_its_limits_at_its_start(worker_reads_celery_only):
    traits = WorkerTraits.of(StartingWorker(soft_time_limit=30))
    assert traits.in_worker and traits.sends_task_events and traits.time_limits == (None, 30)
    assert traits.accept_content == frozenset(current_app.conf.accept_content)
    message, grant = TaskMessage(step.name, "task-1", ("k", 3), {}, {}), Grant("k", 7, 2, b"")
    assert local_request(current_app, message, grant, "w1@host", traits) is None, "its limit holds"
    assert local_request(current_app, message, grant, "w1@host", WorkerTraits.of(StartingWorker())) is not None


@pytest.mark.parametrize("accept", ["json", None, [["json"]], ["json", 3]])
def test_an_accept_content_that_is_not_a_list_of_names_is_read_from_the_app_and_the_limits_still_noted(accept):
    before = current_app.conf.accept_content
    current_app.conf.accept_content = accept
    try:
        traits = WorkerTraits.of(StartingWorker(time_limit=60))
        assert traits.accept_content is None and traits.accepted(current_app) is accept
    finally:
        current_app.conf.accept_content = before
    assert traits.in_worker and traits.time_limits == (60, None)


def test_a_worker_takes_the_limits_it_noted_not_the_apps_as_changed_since(worker_reads_celery_only):
    """As Celery's pool: a worker's limits are those it started with (they include the app's then)."""
    message = TaskMessage(step.name, "task-1", ("k", 3), {}, {})
    traits = WorkerTraits.of(StartingWorker())
    current_app.conf.task_soft_time_limit = 10
    try:
        assert local_request(current_app, message, Grant("k", 7, 2, b""), "w1@host", traits) is not None
        assert request_for(step.name) is None, "outside a worker, the app's limits as they are now"
    finally:
        current_app.conf.task_soft_time_limit = None
