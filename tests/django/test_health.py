"""The health view: staff only, no task arguments, 503 when Redis is away."""

import time

import pytest
from django.contrib.auth import get_user_model
from django.test import override_settings
from django.urls import reverse

from django_keyed_queue.gate import Lease, Start
from django_keyed_queue.gate.keys import KeyNames
from django_keyed_queue.process.state import current, get_gate
from django_keyed_queue.records import submissions
from django_keyed_queue.records.models import KeyedTask
from django_keyed_queue.testing import write_submission_rows
from testproject.demo.tasks import step
from tests.django.queues import QUEUE
from tests.gate_redis import DEADLINES, UNWRITTEN, index_scores

pytestmark = pytest.mark.django_db
URL = "/keyed-queue/health/"


@pytest.fixture
def overdue_holder(settings):
    """Key "overdue": its holder's lease ended long enough ago (two reaper periods) that it is stuck."""
    settings.KEYED_QUEUE_LEASE_SECONDS = 0.05
    settings.KEYED_QUEUE_REAP_INTERVAL_SECONDS = 0.01
    current().reset_gate()
    try:
        step.apply_async(("overdue", 1), queue=QUEUE)
        assert get_gate().start(Start("overdue", 1, 1)).ok  # nobody renews it, no reaper runs
        time.sleep(0.1)
        yield "overdue"
    finally:
        current().reset_gate()


def test_staff_see_depth_and_stuck_keys_without_arguments(staff_client, gate_redis, broker, overdue_holder):
    step.apply_async(("k", "secret-argument"), queue=QUEUE)
    step.apply_async(("k", "another"), queue=QUEUE)
    response = staff_client.get(URL)
    assert response.status_code == 200
    body = response.json()
    assert body["queue_depth"] == 1 and body["redis_reachable"] is True and body["stuck_keys"] == 1
    assert body["oldest_wait_seconds"] >= 0
    assert b"secret" not in response.content


def test_stuck_keys_are_the_live_pages_stuck_keys(staff_client, gate_redis, broker, overdue_holder):
    get_gate().pause("paused-busy")
    step.apply_async(("paused-busy", 1), queue=QUEUE)  # waits behind the pause: stuck
    get_gate().pause("paused-idle")  # nothing waits: not stuck
    step.apply_async(("free", 1), queue=QUEUE)  # granted just now, its dispatch deadline far: not stuck
    gate_redis.zadd(DEADLINES.shard_of("free"), {"free": 0})  # even if the index says to look at it now
    keys = ("overdue", "paused-busy", "paused-idle", "free")
    assert staff_client.get(URL).json()["stuck_keys"] == 2
    staff_client.force_login(get_user_model().objects.create_superuser("root"))
    page = staff_client.get(reverse("admin:keyed_queue_keys")).content.decode()
    assert {k for k in keys if f'class="live-key stuck" data-key="{k}"' in page} == {"overdue", "paused-busy"}


def test_anonymous_users_are_sent_to_log_in_unless_it_is_public(client, gate_redis):
    assert client.get(URL).status_code == 302
    with override_settings(KEYED_QUEUE_HEALTH_PUBLIC=True):
        assert client.get(URL).status_code == 200


def test_an_unreachable_redis_is_a_503(staff_client):
    with override_settings(KEYED_QUEUE_REDIS_URL="redis://127.0.0.1:1/0"):
        response = staff_client.get(URL)
    assert response.status_code == 503 and response.json()["redis_reachable"] is False


def test_a_request_writes_one_bounded_batch_of_a_backlog_of_rows(staff_client, gate_redis, broker, monkeypatch):
    # Keys of one shard of the index: on a cluster, a batch is shared by the shards.
    monkeypatch.setattr(submissions, "PAGE_BATCH", 3 * len(UNWRITTEN.names))
    keys = [k for k in (f"key-{i}" for i in range(1000)) if UNWRITTEN.shard_of(k) == UNWRITTEN.shard_of("k")][:6]
    step.apply_async_many([("k", 0)] + [(key, 1) for key in keys], queue=QUEUE)

    assert staff_client.get(URL).status_code == 200
    assert KeyedTask.objects.count() == 3, "one batch of keys written, the rest left to the workers"
    assert len(index_scores(gate_redis, UNWRITTEN)) == 4
    assert write_submission_rows() == 4


def test_the_live_page_of_one_key_writes_that_keys_rows_only(staff_client, gate_redis, broker):
    step.apply_async_many([("shown", 1), ("shown", 2), ("other", 1)], queue=QUEUE)
    staff_client.force_login(get_user_model().objects.create_superuser("root"))

    page = staff_client.get(reverse("admin:keyed_queue_keys"), {"key": "shown"}).content.decode()

    assert 'data-key="shown"' in page
    assert sorted(KeyedTask.objects.values_list("key", "ticket")) == [("shown", 1), ("shown", 2)]
    assert (gate_redis.hlen(KeyNames("shown").unwritten), gate_redis.hlen(KeyNames("other").unwritten)) == (0, 1)


def test_unrenewed_runs_are_the_live_pages_runs_whose_worker_may_be_lost(staff_client, gate_redis, broker, settings):
    """A run whose worker stopped renewing its lease (by the gate's deadline), counted and marked alike; a
    run renewed on time is neither."""
    settings.KEYED_QUEUE_LEASE_SECONDS = 3  # renewed every second: told lost 2 s after its last renewal
    current().reset_gate()
    try:
        step.apply_async(("silent", 1), queue=QUEUE)
        step.apply_async(("renewed", 1), queue=QUEUE)
        gate = get_gate()
        assert gate.start(Start("silent", 1, 1, max_lost=1)).ok
        renewed = gate.start(Start("renewed", 1, 1))
        time.sleep(1.2)
        assert gate.renew([Lease("renewed", 1, renewed.token)]) == {Lease("renewed", 1, renewed.token): True}
        time.sleep(1.1)
        assert staff_client.get(URL).json()["unrenewed_runs"] == 1
        staff_client.force_login(get_user_model().objects.create_superuser("root"))
        page = staff_client.get(reverse("admin:keyed_queue_keys")).content.decode()
        marked = {k for k in ("silent", "renewed") if f'class="live-key unrenewed" data-key="{k}"' in page}
        assert marked == {"silent"}
        assert "its worker last renewed its lease 2." in page and "may be lost; the reaper dispatches it again" in page
        assert page.index('data-key="silent"') < page.index('data-key="renewed"'), "the key at risk first"
    finally:
        current().reset_gate()
