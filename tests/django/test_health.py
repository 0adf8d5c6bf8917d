"""The health view: staff only, no task arguments, 503 when Redis is away."""

import pytest
from django.contrib.auth import get_user_model
from django.test import override_settings

from django_keyed_queue.gate import DEADLINE_INDEX
from testproject.demo.tasks import step

from .conftest import QUEUE

pytestmark = pytest.mark.django_db
URL = "/keyed-queue/health/"


@pytest.fixture
def staff_client(client):
    client.force_login(get_user_model().objects.create_user("ops", is_staff=True))
    return client


def test_staff_see_depth_and_stuck_keys_without_arguments(staff_client, gate_redis, broker):
    step.apply_async(("k", "secret-argument"), queue=QUEUE)
    step.apply_async(("k", "another"), queue=QUEUE)
    gate_redis.zadd(DEADLINE_INDEX, {"forgotten": 0})  # a key the reaper should have visited long ago
    response = staff_client.get(URL)
    assert response.status_code == 200
    body = response.json()
    assert body["queue_depth"] == 1 and body["redis_reachable"] is True and body["stuck_keys"] == 1
    assert body["oldest_wait_seconds"] >= 0
    assert b"secret" not in response.content


def test_anonymous_users_are_sent_to_log_in_unless_it_is_public(client, gate_redis):
    assert client.get(URL).status_code == 302
    with override_settings(KEYED_QUEUE_HEALTH_PUBLIC=True):
        assert client.get(URL).status_code == 200


def test_an_unreachable_redis_is_a_503(staff_client):
    with override_settings(KEYED_QUEUE_REDIS_URL="redis://127.0.0.1:1/0"):
        response = staff_client.get(URL)
    assert response.status_code == 503 and response.json()["redis_reachable"] is False
