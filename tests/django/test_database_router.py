"""``KEYED_QUEUE_DATABASE`` with the app's router: every record and idempotency key lives in that database."""

import pytest
from django.core.management import call_command
from django.test import override_settings
from django.utils import timezone

from django_keyed_queue.checks import check_settings
from django_keyed_queue.records.models import IdempotencyKey, KeyedTask
from django_keyed_queue.records.router import KeyedQueueRouter
from django_keyed_queue.records.statuses import Status
from django_keyed_queue.records.transitions import Transition
from django_keyed_queue.testing import write_submission_rows
from testproject.demo.tasks import step
from tests.django.queues import QUEUE

pytestmark = pytest.mark.django_db(databases=["default", "queue"])


@pytest.fixture(autouse=True)
def records_in_their_own_database(settings):
    settings.KEYED_QUEUE_DATABASE = "queue"


def test_submissions_transitions_and_repairs_write_to_the_named_database(broker):
    first = step.apply_async(("routed", 1, 0), queue=QUEUE, idempotency_key="order-1")
    again = step.apply_async(("routed", 1, 0), queue=QUEUE, idempotency_key="order-1")
    assert again.id == first.id
    write_submission_rows()
    assert KeyedTask.objects.using("queue").filter(task_id=first.id, status=Status.DISPATCHED).exists()
    assert IdempotencyKey.objects.using("queue").filter(task_id=first.id).exists()
    assert not KeyedTask.objects.using("default").exists() and not IdempotencyKey.objects.using("default").exists()

    running = {"worker": "w1", "started_at": timezone.now()}
    KeyedTask.objects.apply(Transition(first.id, "routed", 1, Status.RUNNING, 1, running))
    assert KeyedTask.objects.get(task_id=first.id).worker == "w1"  # reads are routed too
    assert KeyedTask.objects.settle(first.id, "routed", 1, Status.FAILED, error="given up") == 1
    assert KeyedTask.objects.using("queue").get(task_id=first.id).status == Status.FAILED
    assert not KeyedTask.objects.using("default").exists()


def test_the_records_migrate_only_into_their_database():
    router = KeyedQueueRouter()
    assert router.allow_migrate("queue", "keyed_queue") is True
    assert router.allow_migrate("default", "keyed_queue") is False
    assert router.allow_migrate("default", "auth") is None
    call_command("migrate", "keyed_queue", database="queue", verbosity=0)  # nothing left to do, nothing fails


def test_a_database_the_project_lacks_or_a_missing_router_is_refused():
    with override_settings(KEYED_QUEUE_DATABASE="records"):
        assert [p.id for p in check_settings()] == ["keyed_queue.E005"]
    with override_settings(DATABASE_ROUTERS=[]):
        assert [p.id for p in check_settings()] == ["keyed_queue.E006"]
    assert check_settings() == []
