"""Values no supported database can store are refused at submission; a record the database refuses anyway
is set aside, and holds back no other record, the reaper or the commands (G3, G7)."""

import io
import json
import logging

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.utils import timezone

from django_keyed_queue import InvalidArguments, InvalidKey, keyed_serial_task
from django_keyed_queue.gate import Submission
from django_keyed_queue.gate.keys import KeyNames
from django_keyed_queue.messaging.message import HEADER
from django_keyed_queue.process.state import get_gate
from django_keyed_queue.records import submissions
from django_keyed_queue.records.models import IdempotencyKey, KeyedTask
from django_keyed_queue.records.recorder import Recorder
from django_keyed_queue.records.statuses import Status
from django_keyed_queue.records.transitions import Transition
from django_keyed_queue.testing import write_submission_rows
from testproject.demo.tasks import step
from tests.django.queues import QUEUE
from tests.gate_redis import UNWRITTEN, index_scores

from .test_recovery import lose_a_running_task

pytestmark = pytest.mark.django_db

ON_POSTGRESQL = connection.vendor == "postgresql"


@keyed_serial_task(key="{key}", name="tests." + "x" * 299)
def long_named(key):
    pass


def nothing_left(gate_redis, broker):
    assert not KeyedTask.objects.exists() and not IdempotencyKey.objects.exists()
    assert gate_redis.dbsize() == 0 and broker.llen(QUEUE) == 0


def submit_as(how: str, task, args: tuple, **options):
    """Submit one call of ``task`` the way ``how`` names: every public way in goes through the same checks."""
    if how == "apply_async":
        return task.apply_async(args, queue=QUEUE, **options)
    if how == "countdown":
        return task.apply_async(args, queue=QUEUE, countdown=60, **options)
    if how == "apply_async_many":
        key = options.pop("idempotency_key", None)
        return task.apply_async_many([args], queue=QUEUE, idempotency_keys=[key], **options)
    with transaction.atomic():  # delay_on_commit: bad input raises inside the transaction
        return task.apply_async_on_commit(args, queue=QUEUE, **options)


WAYS_IN = ["apply_async", "countdown", "apply_async_many", "on_commit"]


@pytest.mark.parametrize("how", WAYS_IN)
@pytest.mark.parametrize(
    ("task", "args", "options", "error", "match"),
    [
        (step, ("acct:a\x00b", 1), {}, InvalidKey, r"the key 'acct:a\\x00b' contains a NUL character"),
        (step, ("a", 1), {"task_id": "t" * 300}, InvalidArguments, "task_id 'tttt.* 300 characters long, over the"),
        (step, ("a", 1), {"task_id": "t\x00"}, InvalidArguments, "task_id 't\\\\x00' contains a NUL character"),
        (step, ("a", 1), {"task_id": 12}, InvalidArguments, "task_id 12 must be a str, got int"),
        (step, ("a", 1), {"idempotency_key": "k\x00"}, InvalidArguments, "idempotency_key 'k\\\\x00' contains a NUL"),
        (step, ("a", 1), {"idempotency_key": "k" * 256}, InvalidArguments, "idempotency_key 'kkk.* over the maximum"),
        (step, ("a", 1), {"argsrepr": "(\x00)"}, InvalidArguments, "argsrepr '\\(\\\\x00\\)' contains a NUL"),
        (step, ("a", 1), {"kwargsrepr": "\x00"}, InvalidArguments, "kwargsrepr '\\\\x00' contains a NUL"),
        (long_named, ("a",), {}, InvalidArguments, "^a keyed task: task name 'tests.xxx.* 305 characters long"),
    ],
)
def test_a_value_no_database_can_store_is_refused_naming_it_and_nothing_is_written(
    how, task, args, options, error, match, gate_redis, broker
):
    if how == "apply_async_many" and "task_id" in options:
        pytest.skip("a bulk submission refuses any task_id")
    with pytest.raises(error, match=match):
        submit_as(how, task, args, **options)
    nothing_left(gate_redis, broker)


def test_the_error_for_a_huge_key_names_it_without_echoing_it(gate_redis, broker):
    with pytest.raises(InvalidKey) as refused:
        step.apply_async(("k" * 5000, 1), queue=QUEUE)
    assert "5000 characters long" in str(refused.value) and len(str(refused.value)) < 300
    nothing_left(gate_redis, broker)


def test_the_longest_values_a_record_holds_are_accepted_and_written(gate_redis, broker):
    result = step.apply_async(("k" * 200, 1), queue=QUEUE, task_id="t" * 255, idempotency_key="i" * 255)
    assert write_submission_rows() == 1
    row = KeyedTask.objects.get()
    assert (row.task_id, row.key) == (result.id, "k" * 200)


def refuse_rows(name: str, *, condition: str, pg_errcode: str) -> None:
    """Make the database refuse every INSERT or UPDATE of a record matching ``condition`` (SQL over NEW),
    as it refuses a value it cannot store; the test's transaction, rolled back, takes the trigger with it.
    PostgreSQL raises ``pg_errcode``; SQLite, which stores NUL and any length, a trigger's abort."""
    table = KeyedTask._meta.db_table
    with connection.cursor() as cursor:
        if ON_POSTGRESQL:
            cursor.execute(
                f"CREATE FUNCTION {name}() RETURNS trigger AS $$ BEGIN IF {condition} THEN "
                f"RAISE EXCEPTION 'refused' USING ERRCODE = '{pg_errcode}'; END IF; RETURN NEW; END $$ LANGUAGE plpgsql"
            )
            cursor.execute(
                f"CREATE TRIGGER {name} BEFORE INSERT OR UPDATE ON {table} FOR EACH ROW EXECUTE FUNCTION {name}()"
            )
        else:
            for event in ("INSERT", "UPDATE"):
                cursor.execute(
                    f"CREATE TRIGGER {name}_{event} BEFORE {event} ON {table} WHEN {condition} "
                    "BEGIN SELECT RAISE(ABORT, 'refused'); END"
                )


@pytest.fixture
def refused_key(db):
    """A key whose rows the database refuses, as it refuses a value validation missed (PostgreSQL: a
    NUL, 22021)."""
    refuse_rows("refuse_poison", condition="NEW.key = 'poison'", pg_errcode="22021")
    return "poison"


def refusals(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "refused by the database and set aside" in r.getMessage()]


def test_a_record_the_database_refuses_is_set_aside_once_and_every_other_row_is_written(
    gate_redis, broker, refused_key, caplog
):
    poisoned = step.apply_async((refused_key, 1), queue=QUEUE)
    clean = [step.apply_async((f"k{i}", i), queue=QUEUE) for i in range(20)]
    with caplog.at_level(logging.ERROR):
        write_submission_rows()
        assert set(KeyedTask.objects.values_list("task_id", flat=True)) == {r.id for r in clean}
        write_submission_rows()
        submissions.write_due(get_gate())
    (logged,) = refusals(caplog)
    assert poisoned.id in logged and "key='poison'" in logged and step.name in logged, "named once"
    assert not index_scores(gate_redis, UNWRITTEN), "set aside: no writer tries it again"
    assert not gate_redis.exists(KeyNames(refused_key).unwritten)


def test_a_worker_transition_the_database_refuses_holds_back_no_other(gate_redis, refused_key, caplog):
    recorder = Recorder()
    create = {"task_name": step.name, "enqueued_at": timezone.now(), "args": (), "kwargs": {}}
    for key in ("a", refused_key, "b"):
        recorder.buffer(Transition(f"id-{key}", key, 1, Status.RUNNING, 1, {"worker": "w\x00"}, create=create))
    with caplog.at_level(logging.ERROR):
        recorder.flush(wait_for_rows=False)
        recorder.flush(wait_for_rows=False)
    rows = dict(KeyedTask.objects.values_list("key", "worker"))
    assert rows == {"a": "w\ufffd", "b": "w\ufffd"}, "free text is made storable, not refused"
    assert len(refusals(caplog)) == 1 and recorder.peek(("id-poison", refused_key, 1)) is None


def test_an_error_text_with_nul_is_recorded(gate_redis, broker):
    result = step.apply_async(("a", 1), queue=QUEUE)
    write_submission_rows()
    KeyedTask.objects.settle(result.id, "a", 1, Status.FAILED, error="ValueError: a\x00b")
    assert KeyedTask.objects.get().error == "ValueError: a\ufffdb"


@pytest.mark.skipif(not ON_POSTGRESQL, reason="SQLite stores NUL and any length")
def test_records_validation_missed_are_set_aside_on_postgresql(gate_redis, broker, caplog):
    """What an older producer or another writer may have kept in the gate, past today's checks."""
    gate = get_gate()
    for key, task_id in (("a\x00b", "id-nul-key"), ("c", "t" * 300), ("d", "nul\x00id")):
        record = submissions.encode_record(task_id, step.name, "args=()")
        message = json.dumps({"task": step.name, "id": task_id}).encode()
        gate.submit(Submission(key, message, task_id=task_id, record=record))
    clean = step.apply_async(("e", 1), queue=QUEUE)
    with caplog.at_level(logging.ERROR):
        write_submission_rows()
    assert list(KeyedTask.objects.values_list("task_id", flat=True)) == [clean.id]
    assert len(refusals(caplog)) == 3 and not index_scores(gate_redis, UNWRITTEN)


def test_the_reaper_and_the_commands_go_on_past_a_refused_record(gate_redis, broker, refused_key):
    lost = lose_a_running_task(gate_redis, broker, max_lost=3, key="held")
    step.apply_async((refused_key, 1), queue=QUEUE)
    broker.delete(QUEUE)
    out = io.StringIO()
    call_command("keyed_queue_reap", stdout=out)
    assert "redispatch key='held' ticket=1" in out.getvalue()
    (message,) = [json.loads(m) for m in broker.lrange(QUEUE, 0, -1)]
    assert message["headers"]["id"] == lost.id and message["headers"][HEADER]["dispatch"] == 2
    assert KeyedTask.objects.get(task_id=lost.id).status == "dispatched"
    status = io.StringIO()
    call_command("keyed_queue_status", stdout=status)
    assert "redis: reachable" in status.getvalue()


def test_the_reaper_recovers_keys_while_the_records_database_refuses_every_write(gate_redis, broker):
    lost = lose_a_running_task(gate_redis, broker, max_lost=3, key="held")
    write_submission_rows()
    # Every write of a record now fails, as with a database that is down (PostgreSQL: 08006).
    refuse_rows("refuse_all", condition="TRUE", pg_errcode="08006")
    out = io.StringIO()
    call_command("keyed_queue_reap", stdout=out)
    assert "redispatch key='held' ticket=1" in out.getvalue()
    (message,) = [json.loads(m) for m in broker.lrange(QUEUE, 0, -1)]
    assert message["headers"]["id"] == lost.id, "published though its record could not be written"
