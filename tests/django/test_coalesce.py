"""``coalesce=True`` without workers: rows, results, idempotency keys, and what the option refuses."""

import io
import json
from datetime import UTC, datetime

import pytest
from celery.backends.base import DisabledBackend
from django.core.management import call_command
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_keyed_queue import InvalidArguments, explain, keyed_serial_task
from django_keyed_queue.gate import Submission
from django_keyed_queue.gate.keys import KeyNames
from django_keyed_queue.process.state import current
from django_keyed_queue.records import submissions
from django_keyed_queue.records.models import IdempotencyKey, KeyedTask
from django_keyed_queue.testing import write_submission_rows
from testproject.demo.tasks import debounced_step, latest_step, step
from tests.django.queues import QUEUE

pytestmark = pytest.mark.django_db


def test_one_runs_the_latest_waits_and_the_rest_are_superseded_each_naming_its_replacement(gate_redis, broker):
    running = latest_step.apply_async(("a", 0), queue=QUEUE)
    results = [latest_step.apply_async(("a", n), queue=QUEUE) for n in range(1, 6)]

    assert write_submission_rows() == 6
    rows = {r.task_id: r for r in KeyedTask.objects.all()}
    assert rows[running.id].status == "dispatched"
    assert rows[results[-1].id].status == "waiting"
    for replaced, replacement in zip(results, results[1:], strict=False):
        row = rows[replaced.id]
        assert (row.status, row.superseded_by, row.attempts) == ("superseded", replacement.id, 0)
        assert row.finished_at is not None and row.started_at is None
        assert row.enqueued_at <= row.finished_at and f"args=('a', {results.index(replaced) + 1})" in row.arguments
    assert broker.llen(QUEUE) == 1, "only the running one's message went out"
    assert gate_redis.lrange(KeyNames("a").queue, 0, -1) == [str(rows[results[-1].id].ticket).encode()]


# Celery's Redis result backend calls redis-py's SETEX, which redis-py 8 deprecates.
@pytest.mark.filterwarnings("ignore:Call to deprecated setex:DeprecationWarning")
def test_a_superseded_tasks_result_reads_revoked(gate_redis, broker):
    if isinstance(latest_step.backend, DisabledBackend):  # tox's oldest runs this tier without one
        pytest.skip("no result backend is configured (TESTPROJECT_RESULTS=0)")
    latest_step.apply_async(("a", 0), queue=QUEUE)
    replaced = latest_step.apply_async(("a", 1), queue=QUEUE)
    latest_step.apply_async(("a", 2), queue=QUEUE)

    assert replaced.state == "REVOKED"


def test_an_idempotency_key_that_gave_the_replaced_task_gives_its_replacement(gate_redis, broker):
    latest_step.apply_async(("a", 0), queue=QUEUE)
    replaced = latest_step.apply_async(("a", 1), queue=QUEUE, idempotency_key="edit-1")
    replacement = latest_step.apply_async(("a", 2), queue=QUEUE)

    again = latest_step.apply_async(("a", 1), queue=QUEUE, idempotency_key="edit-1")

    assert again.id == replacement.id != replaced.id
    assert len(gate_redis.lrange(KeyNames("a").queue, 0, -1)) == 1, "the duplicate took no ticket"


def test_the_writer_hands_the_keys_over_when_the_producer_did_not(gate_redis, broker):
    """A producer killed right after the gate's call: the row and the keys still end right."""
    latest_step.apply_async(("a", 0), queue=QUEUE)
    replaced = latest_step.apply_async(("a", 1), queue=QUEUE, idempotency_key="edit-1")
    gate = current().gate
    message = gate_redis.hget(KeyNames("a").messages, 2)
    envelope = json.loads(message)
    envelope["id"] = "by-gate-alone"
    gate.submit(Submission("a", json.dumps(envelope).encode(), task_id="by-gate-alone", coalesce=latest_step.name))

    write_submission_rows()

    assert KeyedTask.objects.get(task_id=replaced.id).superseded_by == "by-gate-alone"
    assert IdempotencyKey.objects.get().task_id == "by-gate-alone"


def test_tasks_that_do_not_coalesce_share_the_key_and_keep_their_place(gate_redis, broker):
    latest_step.apply_async(("a", 0), queue=QUEUE)
    first = latest_step.apply_async(("a", 1), queue=QUEUE)
    other = step.apply_async(("a", 1), queue=QUEUE)
    latest = latest_step.apply_async(("a", 2), queue=QUEUE)

    write_submission_rows()
    rows = {r.task_id: r for r in KeyedTask.objects.all()}
    assert rows[first.id].status == "superseded" and rows[other.id].status == "waiting"
    waiting = [int(t) for t in gate_redis.lrange(KeyNames("a").queue, 0, -1)]
    assert waiting == [rows[other.id].ticket, rows[latest.id].ticket], "submission order"


def test_bulk_submission_coalesces(gate_redis, broker):
    results = latest_step.apply_async_many([("a", n) for n in range(4)], queue=QUEUE)

    write_submission_rows()
    statuses = [KeyedTask.objects.get(task_id=r.id).status for r in results]
    assert statuses == ["dispatched", "superseded", "superseded", "waiting"]


def test_superseded_is_for_coalescing_tasks():
    with pytest.raises(TypeError, match="superseded\\(\\) is for tasks with coalesce=True"):
        step.superseded()


@pytest.mark.parametrize("value", ["yes", 1, 0.0, "false"])
def test_coalesce_must_be_a_bool(value):
    with pytest.raises(TypeError, match="coalesce must be True or False"):
        keyed_serial_task(key="{key}", coalesce=value)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=3000), n=st.integers() | st.floats(allow_nan=False) | st.none())
def test_any_arguments_come_back_on_the_superseded_row(gate_redis, broker, text, n):
    """Whatever the arguments, the superseded row shows them as the submission's row would."""
    key = f"k{len(text)}-{hash((text, n))}"
    latest_step.apply_async((key, 0), queue=QUEUE)
    replaced = latest_step.apply_async((key, n, text), queue=QUEUE)
    latest_step.apply_async((key, 2), queue=QUEUE)
    write_submission_rows()

    row = KeyedTask.objects.get(task_id=replaced.id)
    assert row.status == "superseded"
    waiting = latest_step.apply_async((key + "w", n, text), queue=QUEUE)
    write_submission_rows()
    assert row.arguments == KeyedTask.objects.get(task_id=waiting.id).arguments.replace(key + "w", key)


# --- debounce ------------------------------------------------------------------------------------------


def test_a_debounced_burst_keeps_one_grant_whose_message_waits_out_the_eta(gate_redis, broker):
    results = [debounced_step.apply_async(("a", n), queue=QUEUE) for n in range(3)]
    sent = datetime.now(UTC)

    write_submission_rows()
    rows = {r.task_id: r for r in KeyedTask.objects.all()}
    assert [rows[r.id].status for r in results] == ["superseded", "superseded", "dispatched"]
    assert rows[results[0].id].superseded_by == results[1].id
    holders = gate_redis.hgetall(KeyNames("a").holders)
    assert list(holders) == [str(rows[results[-1].id].ticket).encode()]
    last = [json.loads(m) for m in broker.lrange(QUEUE, 0, -1) if json.loads(m)["headers"]["id"] == results[-1].id]
    eta = datetime.fromisoformat(last[0]["headers"]["eta"])
    assert 1.0 < (eta - sent).total_seconds() <= 1.5, "its message carries the eta"


def test_a_debounced_task_refuses_a_countdown_or_an_eta_and_writes_nothing(gate_redis, broker):
    for options in ({"countdown": 5}, {"eta": datetime.now(UTC)}):
        with pytest.raises(InvalidArguments, match="debounced task starts 1.5s after"):
            debounced_step.apply_async(("a", 1), queue=QUEUE, **options)
    assert gate_redis.dbsize() == 0 and broker.llen(QUEUE) == 0 and not KeyedTask.objects.exists()


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"debounce": 0}, ValueError),
        ({"debounce": -1}, ValueError),
        ({"debounce": True}, ValueError),
        ({"debounce": "1s"}, ValueError),
        ({"debounce": float("nan")}, ValueError),
        ({"debounce": float("inf")}, ValueError),
        ({"debounce": 86_401}, ValueError),
        ({"debounce": 1, "coalesce": False}, ValueError),
    ],
)
def test_bad_debounce_fails_at_import(options, error):
    with pytest.raises(error, match="debounce"):
        keyed_serial_task(key="{key}", **options)


def test_debounce_implies_coalesce():
    @keyed_serial_task(key="{key}", debounce=0.5, name="tests.debounced_alone")
    def debounced_alone(key):
        return key

    assert debounced_alone.serial_coalesce and debounced_alone.serial_debounce_ms == 500


def test_the_explanation_and_the_status_command_name_the_replacement(gate_redis, broker):
    latest_step.apply_async(("a", 0), queue=QUEUE)
    replaced = latest_step.apply_async(("a", 1), queue=QUEUE)
    replacement = latest_step.apply_async(("a", 2), queue=QUEUE)
    write_submission_rows()

    explained = explain(replaced.id)
    assert explained.state == "superseded"
    assert any(replacement.id in reason and "replaced it while it waited" in reason for reason in explained.reasons)
    out = io.StringIO()
    call_command("keyed_queue_status", "--task", replaced.id, stdout=out)
    assert replacement.id in out.getvalue()


def test_the_explanation_of_a_debounced_grant_says_when_it_starts(gate_redis, broker):
    debounced_step.apply_async(("a", 0), queue=QUEUE)
    latest = debounced_step.apply_async(("a", 1), queue=QUEUE)
    write_submission_rows()

    explained = explain(latest.id)

    assert explained.state == "dispatched"
    first = explained.reasons[0]
    assert first.startswith("it starts at ") and "it is debounced" in first, explained.reasons


def test_a_row_written_while_its_ticket_is_replaced_still_ends_superseded(gate_redis, broker):
    """The writer read the waiting task's record, then a newer submission replaced it, then the writer
    wrote the row as waiting and deleted what it read: the next pass makes it superseded."""
    gate = current().gate
    latest_step.apply_async(("a", 0), queue=QUEUE)
    replaced = latest_step.apply_async(("a", 1), queue=QUEUE)
    claims = gate.claim_unwritten(claim_seconds=10)
    read = gate.unwritten(["a"])
    replacement = latest_step.apply_async(("a", 2), queue=QUEUE)
    KeyedTask.objects.apply_setting_aside([submissions.transition(u) for u in read.records], new=True)
    gate.forget_unwritten(read.records, claims)
    assert KeyedTask.objects.get(task_id=replaced.id).status == "waiting"

    write_submission_rows()

    row = KeyedTask.objects.get(task_id=replaced.id)
    assert (row.status, row.superseded_by) == ("superseded", replacement.id)


def test_a_superseded_task_names_the_one_that_runs_and_the_chain_between(gate_redis, broker, admin_client):
    from django.urls import reverse

    latest_step.apply_async(("c", 0), queue=QUEUE)  # holds the key: the rest wait and replace each other
    first, middle, last = (latest_step.apply_async(("c", n), queue=QUEUE) for n in (1, 2, 3))
    write_submission_rows()

    why = explain(first.id)
    assert why.reasons[0].startswith("it was superseded at "), "said as a sentence"
    assert why.reasons[-1] == (
        f"a newer submission of its task, {middle.id}, replaced it while it waited, itself replaced in turn: "
        f"{last.id} is the one that runs"
    )
    page = admin_client.get(
        reverse("admin:keyed_queue_keyedtask_change", args=[KeyedTask.objects.get(task_id=first.id).pk])
    ).content.decode()
    assert f">{middle.id}</a>, itself replaced in turn: <a " in page and f">{last.id}</a> is the one that runs" in page
