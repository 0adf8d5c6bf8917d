"""Django's idioms on keyed tasks: enqueue on commit, eager mode, and the app's own task class."""

import re
import threading

import pytest
from celery import Celery, Task
from django.db import connection, transaction
from django.test import override_settings

from django_keyed_queue import InvalidArguments, InvalidKey, KeyedSerialTask, keyed_serial_task
from django_keyed_queue.gate.keys import KeyNames
from django_keyed_queue.records.models import IdempotencyKey, KeyedTask
from django_keyed_queue.testing import write_submission_rows
from testproject.celery import app
from testproject.demo.tasks import charge, step, write_file
from tests.django.queues import QUEUE

pytestmark = pytest.mark.django_db(transaction=True)


class Rollback(Exception):
    pass


def nothing_written(gate_redis, broker) -> bool:
    return (
        KeyedTask.objects.count() == 0
        and IdempotencyKey.objects.count() == 0
        and gate_redis.dbsize() == 0
        and broker.llen(QUEUE) == 0
    )


def test_delay_on_commit_takes_the_ticket_when_the_transaction_commits(gate_redis, broker):
    with transaction.atomic():
        with transaction.atomic():  # the outermost transaction's commit is the one that counts
            result = step.apply_async_on_commit(("c", 1), queue=QUEUE)
        assert nothing_written(gate_redis, broker), "nothing before the commit"
    write_submission_rows()
    row = KeyedTask.objects.get(task_id=result.id)
    assert (row.key, row.ticket, row.status) == ("c", 1, "dispatched")
    assert broker.llen(QUEUE) == 1


def test_delay_on_commit_outside_a_transaction_submits_at_once(gate_redis, broker):
    result = step.delay_on_commit("c", 1)
    write_submission_rows()
    assert KeyedTask.objects.get(task_id=result.id).ticket == 1


def test_a_rollback_leaves_no_ticket_no_row_no_message_and_no_claim(gate_redis, broker):
    with pytest.raises(Rollback), transaction.atomic():
        step.apply_async_on_commit(("c", 1), queue=QUEUE)
        charge.apply_async_on_commit((7, "10.00"), queue=QUEUE)
        raise Rollback()
    assert nothing_written(gate_redis, broker)


def test_bad_input_raises_at_the_call_inside_the_transaction(gate_redis, broker):
    with transaction.atomic():
        with pytest.raises(InvalidKey):
            write_file.delay_on_commit(None, "data")  # the key callable returns None
        with pytest.raises(InvalidArguments, match="missing a required argument"):
            step.delay_on_commit("c")
        with pytest.raises(InvalidArguments, match="cannot be encoded"):
            step.delay_on_commit("c", object())
    assert nothing_written(gate_redis, broker)


@pytest.mark.skipif(
    connection.vendor == "sqlite", reason="the testproject's SQLite begins each transaction IMMEDIATE: one at a time"
)
def test_tasks_of_one_key_take_tickets_in_commit_order(gate_redis, broker):
    """Two transactions enqueue on one key; the one that started second commits first and goes first.

    (The user's project tier runs this on SQLite as ``startproject`` makes it, with real workers.)
    """
    first_enqueued, second_committed = threading.Event(), threading.Event()
    ids = {}

    def enqueue_then_commit_late():
        try:
            with transaction.atomic():
                ids["late"] = step.apply_async_on_commit(("c", 1), queue=QUEUE).id
                first_enqueued.set()
                assert second_committed.wait(10)
        finally:
            connection.close()

    late = threading.Thread(target=enqueue_then_commit_late)
    late.start()
    assert first_enqueued.wait(10)
    with transaction.atomic():
        ids["early"] = step.apply_async_on_commit(("c", 2), queue=QUEUE).id
    second_committed.set()
    late.join(10)
    write_submission_rows()
    tickets = {row.task_id: row.ticket for row in KeyedTask.objects.all()}
    assert tickets == {ids["early"]: 1, ids["late"]: 2}


def test_an_idempotent_duplicate_in_the_transaction_returns_the_original(gate_redis, broker):
    with transaction.atomic():
        original = charge.apply_async_on_commit((7, "10.00"), queue=QUEUE)
        duplicate = charge.apply_async_on_commit((7, "10.00"), queue=QUEUE)
        assert duplicate.id == original.id
    write_submission_rows()
    assert [row.task_id for row in KeyedTask.objects.all()] == [original.id]
    assert charge.delay(7, "10.00").id == original.id, "and after the commit"


@override_settings(KEYED_QUEUE_SUBMIT_ON_COMMIT=True)
def test_the_setting_makes_delay_wait_for_the_commit(gate_redis, broker):
    with transaction.atomic():
        result = step.apply_async(("c", 1), queue=QUEUE)
        assert nothing_written(gate_redis, broker)
    write_submission_rows()
    assert KeyedTask.objects.get(task_id=result.id).ticket == 1
    with pytest.raises(Rollback), transaction.atomic():
        step.apply_async(("c", 2), queue=QUEUE)
        raise Rollback()
    write_submission_rows()
    assert KeyedTask.objects.count() == 1 and gate_redis.llen(KeyNames("c").queue) == 0


def test_without_the_setting_delay_in_a_transaction_takes_its_ticket_at_once(gate_redis, broker):
    with transaction.atomic():
        step.apply_async(("c", 1), queue=QUEUE)
        assert broker.llen(QUEUE) == 1, "published before the commit, as Celery publishes"


@pytest.fixture
def eager():
    app.conf.task_always_eager = True
    try:
        yield
    finally:
        app.conf.task_always_eager = False


@keyed_serial_task(key="{key}", bind=True, name="tests.django.lease_seen")
def lease_seen(self, key: str) -> list:
    return [self.holds_key(), self.keyed_lease.key, self.keyed_lease.token]


def test_eager_mode_raises_what_a_queued_submission_would(eager, gate_redis, broker):
    with pytest.raises(InvalidKey):
        write_file.delay(None, "data")
    with pytest.raises(InvalidArguments, match="missing a required argument"):
        step.delay("c")
    with pytest.raises(InvalidKey):
        write_file.apply((None, "data"))
    assert step.delay("c", 3).get() == 3
    assert nothing_written(gate_redis, broker), "an eager run goes past the gate"


def test_an_eager_run_holds_its_key(eager):
    assert lease_seen.delay("k").get() == [True, "k", 0]


def test_eager_delay_on_commit_runs_at_the_commit(eager, gate_redis, broker):
    ran = []
    with transaction.atomic():
        step.delay_on_commit("c", 1)
        transaction.on_commit(lambda: ran.append("after"))
        with pytest.raises(InvalidKey):
            write_file.delay_on_commit(None, "data")
    assert ran == ["after"]  # the task ran at the commit, before the callback registered after it


class ProjectTask(Task):
    """A project's own task class, with a method its tasks use and an option of its own."""

    tenant_name = "acme"

    def tenant(self) -> str:
        return self.tenant_name


def keyed_task_of(celery_app: Celery, **options):
    def body(key: str) -> str:
        return key

    task = keyed_serial_task(key="{key}", name=f"tests.django.project_task_{id(celery_app)}", **options)(body)
    celery_app.finalize()
    return celery_app.tasks[task.name]


def test_a_keyed_task_is_built_on_the_app_s_task_class():
    task = keyed_task_of(Celery("project", task_cls=ProjectTask, set_as_current=False))
    assert isinstance(task, KeyedSerialTask) and isinstance(task, ProjectTask) and task.tenant() == "acme"


def test_a_keyed_task_is_built_on_a_base_class_it_is_given():
    task = keyed_task_of(Celery("project", set_as_current=False), base=ProjectTask)
    assert isinstance(task, KeyedSerialTask) and task.tenant() == "acme"


def test_the_django_project_s_keyed_tasks_have_django_s_task_methods():
    from celery.contrib.django.task import DjangoTask

    assert isinstance(app.tasks[step.name], DjangoTask)


def test_a_base_that_is_not_a_task_class_fails_at_import():
    with pytest.raises(TypeError, match="base must be a Celery task class"):
        keyed_serial_task(key="{key}", base=object)


def test_an_unknown_or_misspelt_option_fails_at_import_naming_it():
    with pytest.raises(TypeError, match=r"unknown option 'max_retires' \(did you mean 'max_retries'\?\)"):
        keyed_serial_task(key="{key}", max_retires=3)
    with pytest.raises(TypeError, match="unknown options 'colour', 'max_recovery' .did you mean 'max_recoveries'"):
        keyed_serial_task(key="{key}", max_recovery=2, colour="blue")
    with pytest.raises(TypeError, match="would replace the task's method after_return"):
        keyed_serial_task(key="{key}", after_return="later")


@pytest.mark.parametrize("rate", ["5", "5/x", "0/s", "-1/s", "1.5/s", "five/s", 5])
def test_a_rate_that_is_not_n_per_second_minute_or_hour_fails_at_import(rate):
    with pytest.raises(ValueError, match=f'rate must be "N/s", "N/m" or "N/h".*got {re.escape(repr(rate))}'):
        keyed_serial_task(key="{key}", rate=rate)


def test_a_rate_and_a_failure_policy_are_the_task_s_own():
    task = keyed_task_of(Celery("project", set_as_current=False), rate="30/m", on_failure="block")
    assert (task.serial_rate, task.serial_interval_ms, task.serial_on_failure) == ("30/m", 2000, "block")
    with pytest.raises(ValueError, match="on_failure must be one of 'continue', 'block', got 'stop'"):
        keyed_serial_task(key="{key}", on_failure="stop")


def test_celery_s_options_ours_and_a_base_class_s_own_attributes_are_taken():
    options = {"acks_late": True, "max_retries": 2, "rate_limit": "1/s",
               "autoretry_for": (ValueError,), "retry_backoff": True, "typing": False,
               "max_recoveries": 1, "idempotent": True, "max_waiting": 5}  # fmt: skip
    task = keyed_task_of(Celery("project", set_as_current=False), **options)
    assert (task.max_recoveries, task.max_waiting, task.acks_late, task.max_retries) == (1, 5, True, 2)
    assert keyed_task_of(Celery("p", set_as_current=False), base=ProjectTask, tenant_name="other").tenant() == "other"


def test_wait_for_keyed_tasks_names_the_tasks_that_have_not_ended(gate_redis, broker):
    from django_keyed_queue.testing import wait_for_keyed_tasks

    waiting = step.apply_async(("c", 1), queue=QUEUE)  # no worker consumes QUEUE
    with pytest.raises(AssertionError, match=rf"demo\.tasks\.step\[{waiting.id}\] key='c' dispatched"):
        wait_for_keyed_tasks(waiting.id, timeout=0.3)
    with pytest.raises(AssertionError, match="unknown-id: no record yet"):
        wait_for_keyed_tasks("unknown-id", timeout=0.3)
    write_submission_rows()
    KeyedTask.objects.filter(task_id=waiting.id).update(status="succeeded")
    assert [row.task_id for row in wait_for_keyed_tasks(timeout=0.3)] == [waiting.id]
