"""Idempotency in sight: a key's text, its task and the duplicates it answered, on the task's page and
on the idempotency keys' page, which finds a key by its text."""

import html

import pytest
from django.db import transaction
from django.urls import reverse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_keyed_queue import InvalidArguments
from django_keyed_queue.ops.display import at
from django_keyed_queue.records.models import IdempotencyKey, KeyedTask
from django_keyed_queue.testing import write_submission_rows
from testproject.demo.tasks import charge, step
from tests.django.queues import QUEUE

LIST = reverse("admin:keyed_queue_idempotencykey_changelist")


def task_page(client, task_id: str) -> str:
    write_submission_rows()
    pk = KeyedTask.objects.get(task_id=task_id).pk
    return html.unescape(client.get(reverse("admin:keyed_queue_keyedtask_change", args=[pk])).content.decode())


@pytest.mark.django_db(transaction=True)
def test_a_key_counts_the_duplicates_it_answered_and_both_pages_say_so(admin_client, gate_redis, broker):
    first = step.apply_async(("k", 1), queue=QUEUE, idempotency_key="customer-5512/sync")
    assert "no duplicate yet" in task_page(admin_client, first.id)
    for _ in range(2):
        assert step.apply_async(("k", 1), queue=QUEUE, idempotency_key="customer-5512/sync").id == first.id
    claim = IdempotencyKey.objects.get()
    assert (claim.key, claim.task_id, claim.duplicates) == ("customer-5512/sync", first.id, 2)

    page = task_page(admin_client, first.id)
    assert f"key customer-5512/sync (until {at(claim.expires_at)})" in page.replace("<code>", "").replace("</code>", "")
    assert f"answered 2 duplicates, the last at {at(claim.last_duplicate_at)}" in page

    listed = html.unescape(admin_client.get(LIST).content.decode())
    assert "customer-5512/sync" in listed and first.id in listed and at(claim.created_at) in listed
    assert "result (" not in listed, "no count of every row"


@pytest.mark.django_db(transaction=True)
def test_a_duplicate_whose_transaction_rolled_back_is_not_counted(gate_redis, broker):
    first = step.apply_async(("k", 1), queue=QUEUE, idempotency_key="once")
    with pytest.raises(RuntimeError), transaction.atomic():
        assert step.apply_async(("k", 1), queue=QUEUE, idempotency_key="once").id == first.id
        raise RuntimeError("rolled back")
    assert IdempotencyKey.objects.get().duplicates == 0
    with transaction.atomic():
        assert step.apply_async(("k", 1), queue=QUEUE, idempotency_key="once").id == first.id
        assert IdempotencyKey.objects.get().duplicates == 0, "counted once it commits, not before"
    assert IdempotencyKey.objects.get().duplicates == 1


@pytest.mark.django_db
def test_a_task_idempotent_by_its_arguments_shows_no_key_text(admin_client, gate_redis, broker):
    first = charge.apply_async((7, "10.00"), queue=QUEUE)
    assert IdempotencyKey.objects.get().key == ""
    assert "its arguments (until" in task_page(admin_client, first.id)
    assert "its arguments (not shown)" in admin_client.get(LIST).content.decode()


@pytest.mark.django_db
def test_the_search_finds_a_key_or_a_task_id_whole_and_as_written(admin_client, gate_redis, broker):
    ids = {key: step.apply_async(("k", 1), queue=QUEUE, idempotency_key=key).id for key in ("order-1", "order-10")}

    def found(term: str) -> set[str]:
        page = admin_client.get(LIST, {"q": term}).content.decode()
        return {key for key in ids if f">{key}<" in page}

    assert found("order-1") == {"order-1"}, "whole, not a prefix"
    assert found(ids["order-10"]) == {"order-10"}
    assert found("ORDER-1") == set(), "as written"
    assert found("") == {"order-1", "order-10"}


@pytest.mark.django_db
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.text(min_size=1, max_size=300))
def test_any_key_text_is_stored_as_given_and_found_or_refused_leaving_nothing(admin_client, gate_redis, key):
    claims, rows = IdempotencyKey.objects.count(), KeyedTask.objects.count()
    try:
        first = step.apply_async(("k", 1), queue=QUEUE, idempotency_key=key)
    except InvalidArguments as refused:
        assert "idempotency_key" in str(refused)
        assert (IdempotencyKey.objects.count(), KeyedTask.objects.count()) == (claims, rows), "nothing written"
        return
    assert IdempotencyKey.objects.get(task_id=first.id).key == key
    assert step.apply_async(("k", 1), queue=QUEUE, idempotency_key=key).id == first.id
    response = admin_client.get(LIST, {"q": key})
    assert response.status_code == 200
    if key.strip() == key:  # the admin's search strips what it is given, as Django's does
        assert first.id in response.content.decode()
