"""Small things users hit at the edges: hostile form values, a secret-keyed digest, checks Celery makes
at the call, a key function checked at import, a paused key with nothing in it."""

import io
import json

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import CommandError, call_command
from django.test import override_settings
from django.urls import reverse
from django.utils.crypto import salted_hmac

from django_keyed_queue import IdempotencyConflict, InvalidKey, keyed_serial_task
from django_keyed_queue.records.idempotency import DIGEST_SALT, arguments_fingerprint
from django_keyed_queue.records.models import IdempotencyKey, KeyedTask
from django_keyed_queue.testing import write_submission_rows
from testproject.demo.tasks import step
from tests.django.queues import QUEUE

pytestmark = pytest.mark.django_db


def test_an_explicit_key_s_arguments_digest_is_keyed_with_the_secret_and_survives_its_rotation(
    gate_redis, broker, settings
):
    first = step.apply_async(("k", 1), queue=QUEUE, idempotency_key="charge-7")
    stored = IdempotencyKey.objects.get().arguments
    bound = {"key": "k", "n": 1, "duration": 0.0}
    assert stored != arguments_fingerprint(step.name, bound), "no plain SHA-256 to guess small arguments from"
    canonical = json.dumps(["args", step.name, dict(sorted(bound.items()))], separators=(",", ":"))
    assert stored == salted_hmac(DIGEST_SALT, canonical, algorithm="sha256").hexdigest()
    with override_settings(SECRET_KEY="rotated-secret-key-" * 3, SECRET_KEY_FALLBACKS=[settings.SECRET_KEY]):
        assert step.apply_async(("k", 1), queue=QUEUE, idempotency_key="charge-7").id == first.id
        with pytest.raises(IdempotencyConflict):
            step.apply_async(("k", 2), queue=QUEUE, idempotency_key="charge-7")


@pytest.fixture
def viewer(client):
    user = User.objects.create_user("vic", password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename="view_idempotencykey"))
    client.force_login(user)
    return client


def test_the_idempotency_keys_admin_shows_no_digest_and_refuses_lookups(gate_redis, broker, viewer):
    step.apply_async(("k", 1), queue=QUEUE, idempotency_key="charge-7")
    key = IdempotencyKey.objects.get()
    changelist = reverse("admin:keyed_queue_idempotencykey_changelist")
    for page in (viewer.get(changelist), viewer.get(reverse("admin:keyed_queue_idempotencykey_change", args=[key.pk]))):
        text = page.content.decode()
        assert page.status_code == 200 and key.task_id in text
        assert key.arguments not in text and key.fingerprint not in text and key.fingerprint[:12] not in text
    for lookup in ("arguments__startswith=a", "fingerprint__startswith=a", "task_id__contains=a"):
        assert viewer.get(f"{changelist}?{lookup}").status_code == 400, lookup


@pytest.mark.parametrize("ticket", ["²", "١", "9" * 30, "-1", " 1", ""])
def test_a_release_with_a_ticket_that_is_not_a_number_is_a_bad_request(gate_redis, admin_client, ticket):
    response = admin_client.post(
        reverse("admin:keyed_queue_key_act"), {"action": "release", "key": "k", "ticket": ticket}
    )
    assert response.status_code == 400


def test_status_of_a_paused_key_with_no_tasks_says_it_is_paused(gate_redis):
    call_command("keyed_queue_pause", "quiet", stdout=io.StringIO())
    out = io.StringIO()
    call_command("keyed_queue_status", "--key", "quiet", stdout=out)
    assert "key 'quiet': paused, last ticket 0" in out.getvalue()


def test_an_operator_s_huge_key_is_named_without_being_echoed(gate_redis):
    with pytest.raises(CommandError) as refused:
        call_command("keyed_queue_pause", "k" * 5000)
    assert "5000 characters long" in str(refused.value) and len(str(refused.value)) < 300


def test_a_key_function_that_cannot_take_the_task_s_arguments_fails_at_import():
    with pytest.raises(InvalidKey, match=r"cannot take the task's arguments \(account_id, full\)"):

        @keyed_serial_task(key=lambda account_id: f"a:{account_id}")
        def sync(account_id, full=False):
            pass

    with pytest.raises(InvalidKey, match=r"cannot take the task's arguments \(account_id\)"):

        @keyed_serial_task(key=lambda account_id, full: f"a:{account_id}")
        def sync_required(account_id, full=False):
            pass

    @keyed_serial_task(key=lambda account_id, full=False: f"a:{account_id}", name="tests.fitting_key")
    def fits(account_id, full=False):
        pass


@keyed_serial_task(key="{key}", soft_time_limit=10, time_limit=5, name="tests.limits_upside_down")
def limits_upside_down(key):
    pass


@keyed_serial_task(key="{key}", typing=False, name="tests.untyped")
def untyped(key, n):
    pass


def test_celery_s_checks_at_the_call_are_made_as_celery_makes_them(gate_redis, broker):
    with pytest.raises(ValueError, match="soft_time_limit must be less than or equal to time_limit"):
        limits_upside_down.apply_async(("k",), queue=QUEUE)
    assert gate_redis.dbsize() == 0 and broker.llen(QUEUE) == 0
    # typing=False: Celery sends an unexpected keyword, and the task fails in the worker.
    sent = untyped.apply_async(("k", 1), {"surprise": True}, queue=QUEUE)
    assert json.loads(broker.lindex(QUEUE, 0))["headers"]["id"] == sent.id
    write_submission_rows()
    assert KeyedTask.objects.get().key == "k"


def test_a_drifted_key_is_found_however_late_in_a_long_key_it_differs():
    from django_keyed_queue.worker.run import key_drift

    ticket_key, drifted = "k" * 150 + "a", "k" * 150 + "b"  # alike in all an error shows of them
    assert key_drift(step, ticket_key, (ticket_key, 1), {}) is None
    error = key_drift(step, ticket_key, (drifted, 1), {})
    assert isinstance(error, InvalidKey) and "its ticket is of key 'kkkk" in str(error)
