import pytest
import redis
from django.conf import settings
from django.contrib.auth.models import Permission, User
from django.test import override_settings

from tests.django.queues import QUEUE
from tests.gate_redis import ON_CLUSTER, WORKERLESS_GATE_DB


@pytest.fixture
def gate_db() -> int:
    return WORKERLESS_GATE_DB


@pytest.fixture(autouse=True, scope="session")
def _counts_added_when_a_test_says():
    """This process adds its counts for the metrics only when a test, or the ``gate_redis`` fixture around each
    test, flushes them: a flush in the background would write the totals into a test (or a fuzzed example)
    that checks Redis holds nothing after a refused call."""
    from django_keyed_queue.process import totals

    every, totals.FLUSH_SECONDS = totals.FLUSH_SECONDS, 3600.0
    yield
    totals.FLUSH_SECONDS = every


@pytest.fixture(autouse=True, scope="session")
def _records_written_when_a_test_says():
    """This process writes its buffered records only when a test flushes them, in the test's transaction:
    the recorder's pass in the background writes on a connection of its own, outside it (rows a later test
    would find), and waits up to ``BACKGROUND_LOCK_WAIT_SECONDS`` for the lock the test's transaction holds."""
    with override_settings(KEYED_QUEUE_RECORD_FLUSH_SECONDS=3600.0):
        yield


@pytest.fixture(autouse=True)
def _records_buffered_in_a_test_end_with_it():
    """What a test buffered and did not flush names rows its transaction rolled back: a later test's flush
    would write it among its own."""
    from django_keyed_queue.process.state import current

    yield
    current().recorder.discard()


@pytest.fixture(autouse=True)
def _gate_without_workers(request, redis_server, settings, gate_db):
    """This tier's gate is a database the session's workers do not reap (or a cluster they do not know)."""
    if ON_CLUSTER:
        settings.KEYED_QUEUE_REDIS_URL = request.getfixturevalue("gate_cluster").url
        settings.KEYED_QUEUE_REDIS_CLUSTER = True
    else:
        settings.KEYED_QUEUE_REDIS_URL = f"{redis_server.url}/{gate_db}"


@pytest.fixture
def broker(redis_server):
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    client.delete(QUEUE)
    yield client
    client.delete(QUEUE)
    client.close()


def operator(name: str, *codenames: str) -> User:
    """A staff user who may view keyed tasks, plus the given permissions."""
    user = User.objects.create_user(name, password="pw", is_staff=True)
    perms = Permission.objects.filter(
        content_type__app_label="keyed_queue", codename__in=["view_keyedtask", *codenames]
    )
    user.user_permissions.set(perms)
    return user


@pytest.fixture
def as_user(client):
    def login(name: str, *codenames: str):
        client.force_login(operator(name, *codenames))
        return client

    return login


@pytest.fixture
def staff_client(client):
    """A logged-in staff user with no permission of ours (the health view asks no more)."""
    client.force_login(User.objects.create_user("ops", is_staff=True))
    return client


@pytest.fixture
def viewer_client(client):
    """A logged-in staff user who may view keyed tasks: what the task list and the metrics ask."""
    client.force_login(operator("viewer"))
    return client
