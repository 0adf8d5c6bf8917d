"""With Celery's ``task_send_sent_event``, a keyed task's ``task-sent`` event goes out at its submission, as a
plain task's does, also while it waits for its key in Redis: Flower and ``celery events`` show it from then
(as PENDING, Celery's state for a sent task), not only once a worker receives it."""

import contextlib
import threading

import pytest
from celery import current_app

from django_keyed_queue.records.models import KeyedTask
from django_keyed_queue.testing import write_submission_rows
from testproject.demo.tasks import step
from tests.django.queues import QUEUE
from tests.waiting import wait_until

pytestmark = pytest.mark.django_db


@pytest.fixture
def sent_events():
    """Celery's ``task_send_sent_event`` on for the test."""
    before = current_app.conf.task_send_sent_event
    current_app.conf.task_send_sent_event = True
    yield
    current_app.conf.task_send_sent_event = before


# kombu 5.4's Redis transport, under redis-py 5.3+, subscribes with a call redis-py deprecates: a warning the
# tests' filter turns into an error, in the receiver's thread, which then never subscribes.
@pytest.mark.filterwarnings("ignore:Call to 'get_connection' function with deprecated usage:DeprecationWarning")
def test_a_task_waiting_for_its_key_is_sent_as_far_as_celery_s_events_say(gate_redis, broker, sent_events):
    sent: list[dict] = []
    ready = threading.Event()

    def listen() -> None:
        with current_app.connection_for_read() as connection:
            receiver = current_app.events.Receiver(connection, handlers={"*": lambda event: sent.append(dict(event))})
            ready.set()
            with contextlib.suppress(TimeoutError):  # 3 s without an event: every one sent has come
                receiver.capture(limit=None, timeout=3, wakeup=False)

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    assert ready.wait(10)

    def subscribed() -> bool:
        return bool(broker.pubsub_numpat() or broker.pubsub_channels("*celeryev*"))

    wait_until(subscribed, 10, message="the receiver's subscription")  # made before the tasks are sent
    first = step.apply_async(("sent", 1), queue=QUEUE)
    waiting = step.apply_async(("sent", 2), queue=QUEUE)
    listener.join(15)

    write_submission_rows()
    assert KeyedTask.objects.get(task_id=waiting.id).status == "waiting", "it waits for its key, in Redis"
    assert broker.llen(QUEUE) == 1, "only the first went to the broker"
    assert [(e["uuid"], e["name"], e["queue"]) for e in sent if e["type"] == "task-sent"] == [
        (first.id, step.name, QUEUE),
        (waiting.id, step.name, QUEUE),
    ], "each sent at its submission, the waiting one too"
