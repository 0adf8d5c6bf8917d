"""Worker-side record writes: merged, batched, never moving a record backwards."""

import threading
import time
from datetime import datetime, timedelta

import pytest
from django.db import connections, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from hypothesis import given, settings
from hypothesis import strategies as st
from kombu.utils.json import dumps as kombu_json

from django_keyed_queue.records import recorder as recorder_module
from django_keyed_queue.records.models import KeyedTask
from django_keyed_queue.records.recorder import Recorder
from django_keyed_queue.records.statuses import STATUS_RANK
from django_keyed_queue.records.transitions import CREATE_FIELDS, FIELDS, Transition, describe_arguments
from tests.waiting import wait_until

pytestmark = pytest.mark.django_db


def make_row(**fields):
    defaults = {"task_id": "t1", "task_name": "demo.step", "key": "k", "ticket": 1, "enqueued_at": timezone.now()}
    return KeyedTask.objects.create(**{**defaults, **fields})


def test_a_later_status_applies():
    make_row(status="dispatched")
    KeyedTask.objects.apply(Transition("t1", "k", 1, "running", 1, {"worker": "w1"}))
    row = KeyedTask.objects.get()
    assert (row.status, row.attempts, row.worker) == ("running", 1, "w1")


def test_an_earlier_status_written_late_does_not_move_the_record_back():
    # The finishing worker's "dispatched" can reach the database after the next worker's "succeeded".
    make_row(status="succeeded", attempts=1, started_at=timezone.now())
    dispatched = timezone.now() - timedelta(seconds=1)
    KeyedTask.objects.apply(
        Transition("t1", "k", 1, "dispatched", 0, {"dispatched_at": dispatched, "started_at": timezone.now()})
    )
    row = KeyedTask.objects.get()
    # The late write fills what the row lacks and overwrites nothing.
    assert (row.status, row.attempts, row.dispatched_at) == ("succeeded", 1, dispatched)
    assert row.started_at < dispatched + timedelta(seconds=1)


def test_a_batch_updates_and_creates_in_one_go():
    make_row(task_id="a", status="dispatched")
    make_row(task_id="b", status="running", attempts=1)
    create = {"task_name": "demo.step", "args": ("k", 3), "kwargs": {}, "enqueued_at": timezone.now()}
    KeyedTask.objects.apply(
        Transition("a", "k", 1, "running", 1, {"worker": "w1"}),
        Transition("b", "k", 1, "failed", 1, {"error": "boom"}),
        Transition("c", "k", 9, "running", 1, {}, create),
    )
    rows = {r.task_id: r for r in KeyedTask.objects.all()}
    assert (rows["a"].status, rows["a"].worker) == ("running", "w1")
    assert (rows["b"].status, rows["b"].error) == ("failed", "boom")
    assert (rows["c"].status, rows["c"].ticket, rows["c"].arguments) == ("running", 9, "args=('k', 3) kwargs={}")


def test_a_batch_of_rows_there_rows_to_make_and_rows_to_wait_for_is_a_statement_each():
    """A busy worker's flush: runs whose rows are written, runs that make theirs (younger than the record
    delay), and runs whose rows the writers have yet to write (they wait). One UPDATE, one read of which rows
    are there, the UPDATE again of those, and one INSERT: not a statement a row."""
    for n in range(10):
        make_row(task_id=f"there{n}", status="dispatched")
    create = {"task_name": "demo.step", "args": ("k", 1), "kwargs": {}, "enqueued_at": timezone.now()}
    batch = [
        *(Transition(f"there{n}", "k", 1, "running", 1, {"worker": "w1"}, create) for n in range(10)),
        *(Transition(f"young{n}", "k", 1, "succeeded", 1, {}, create, insert_first=True) for n in range(10)),
        *(Transition(f"unwritten{n}", "k", 1, "running", 1, {}, create) for n in range(10)),
    ]
    with CaptureQueriesContext(connections[KeyedTask.objects.db_for_write()]) as queries:
        waiting = KeyedTask.objects.apply(*batch, create_after=60)

    assert sorted(t.task_id for t in waiting) == [f"unwritten{n}" for n in range(10)]
    statuses = dict(KeyedTask.objects.values_list("task_id", "status"))
    assert statuses == {**{f"there{n}": "running" for n in range(10)}, **{f"young{n}": "succeeded" for n in range(10)}}
    writes = [q["sql"] for q in queries if q["sql"].lstrip("0123456789 times:").startswith(("INSERT", "UPDATE"))]
    assert len(writes) == 3, f"two UPDATEs and an INSERT, not one a row: {len(writes)}"


def test_a_retry_runs_as_a_later_attempt():
    make_row(status="retrying", attempts=1)
    KeyedTask.objects.apply(Transition("t1", "k", 1, "running", 2))
    assert (KeyedTask.objects.get().status, KeyedTask.objects.get().attempts) == ("running", 2)
    KeyedTask.objects.apply(Transition("t1", "k", 1, "retrying", 1))
    assert KeyedTask.objects.get().status == "running"


def test_a_missing_row_is_created_from_what_the_worker_knows():
    create = {"task_name": "demo.step", "args": (), "kwargs": {}, "enqueued_at": timezone.now()}
    KeyedTask.objects.apply(Transition("lost-producer", "k", 4, "running", 1, {}, create))
    row = KeyedTask.objects.get(task_id="lost-producer")
    assert (row.status, row.ticket, row.key) == ("running", 4, "k")


def test_submission_row_written_after_the_worker_made_it_keeps_the_workers_status():
    create = {"task_name": "demo.step", "args": (), "kwargs": {}, "enqueued_at": timezone.now()}
    KeyedTask.objects.apply(Transition("fast", "k", 3, "succeeded", 1, {}, create))
    enqueued = timezone.now() - timedelta(seconds=5)
    KeyedTask.objects.insert_submission(
        task_id="fast",
        task_name="demo.step",
        key="k",
        ticket=3,
        status="waiting",
        arguments="args=('k',)",
        enqueued_at=enqueued,
    )
    row = KeyedTask.objects.get(task_id="fast")
    assert (row.status, row.enqueued_at, row.arguments) == ("succeeded", enqueued, "args=('k',)")


def test_transitions_of_one_task_merge_keeping_the_latest_status_and_all_fields():
    started, finished = timezone.now(), timezone.now()
    running = Transition("t1", "k", 1, "running", 1, {"started_at": started, "worker": "w"})
    done = Transition("t1", "k", 1, "succeeded", 1, {"finished_at": finished})
    for merged in (running.merged_with(done), done.merged_with(running)):
        assert merged.status == "succeeded"
        assert merged.fields == {"started_at": started, "worker": "w", "finished_at": finished}


def test_recorder_flushes_in_the_background_within_the_interval():
    make_row(status="dispatched")
    recorder = Recorder()
    with override_settings(KEYED_QUEUE_RECORD_FLUSH_SECONDS=0.05):
        recorder.buffer(Transition("t1", "k", 1, "running", 1))
        recorder.buffer(Transition("t1", "k", 1, "succeeded", 1, {"error": ""}))
        # The background thread has its own connection; in this test's transaction
        # the write is only visible once flushed here, so flush and check the merge.
        recorder.flush()
    assert KeyedTask.objects.get().status == "succeeded"


def test_a_flush_waits_for_the_background_flush_that_took_its_batch(monkeypatch):
    """The thread's connection cannot see this test's row and puts the transition back; the explicit
    flush must not return before that, or what it was asked to write is still unwritten."""
    make_row(status="dispatched")
    recorder = Recorder()
    taken, release = threading.Event(), threading.Event()
    apply = KeyedTask.objects.apply_setting_aside

    def slow_first_pass(transitions, **options):
        if not taken.is_set():
            taken.set()
            release.wait(5)
            return list(transitions)  # as the thread's connection: no row yet, buffered again
        return apply(transitions, **options)

    monkeypatch.setattr(KeyedTask.objects, "apply_setting_aside", slow_first_pass)
    recorder.buffer(Transition("t1", "k", 1, "running", 1))
    background = threading.Thread(target=recorder.flush)
    background.start()
    assert taken.wait(5)
    threading.Timer(0.3, release.set).start()
    began = time.monotonic()
    recorder.flush()  # here, where this test's row is visible
    assert time.monotonic() - began >= 0.25, "returned while the batch was in the other flush's hands"
    background.join(5)
    recorder.close()
    assert KeyedTask.objects.get().status == "running"


@pytest.mark.django_db(transaction=True)
def test_a_flush_in_a_transaction_holding_its_row_s_lock_waits_only_as_the_background_pass_gives_way(
    caplog, monkeypatch
):
    """An operator's action under ``ATOMIC_REQUESTS``: its transaction wrote the row a transition names and
    flushes, while the background pass, on its own connection, has taken the batch and waits for that lock.
    The pass gives way after ``BACKGROUND_LOCK_WAIT_SECONDS`` and the flush writes here (it waited for the
    database's timeout on SQLite, and for good on PostgreSQL)."""
    monkeypatch.setattr(recorder_module, "BACKGROUND_LOCK_WAIT_SECONDS", 0.5)
    make_row(status="dispatched")
    recorder = Recorder()
    caplog.set_level("INFO", logger=recorder_module.__name__)
    try:
        with override_settings(KEYED_QUEUE_RECORD_FLUSH_SECONDS=0.05), transaction.atomic():
            KeyedTask.objects.filter(task_id="t1").update(worker="operator")  # holds the row (SQLite: the database)
            recorder.buffer(Transition("t1", "k", 1, "running", 1))
            wait_until(lambda: recorder.peek(("t1", "k", 1)) is None, timeout=10, message="the pass took the batch")
            began = time.monotonic()
            recorder.flush()
            waited = time.monotonic() - began
            assert KeyedTask.objects.get().status == "running", "written by the flush, in this transaction"
    finally:
        recorder.close()
    assert waited < recorder_module.BACKGROUND_LOCK_WAIT_SECONDS + 3, f"the flush waited {waited:.1f} s"
    row = KeyedTask.objects.get()
    assert (row.status, row.worker) == ("running", "operator")
    assert "gave way to a lock another transaction holds (waited at most 0.5 s); will try again" in caplog.text


def test_a_record_the_database_refuses_is_dropped_and_the_rest_of_its_batch_written():
    """Retried as a batch, it would hold back every later record of its process for good."""
    make_row(status="waiting", ticket=None)
    make_row(status="running", ticket=5)  # the join's run wrote its own row, before the join's record
    make_row(task_id="t2", status="dispatched")
    recorder = Recorder()
    recorder.buffer(Transition("t1", "k", 5, "waiting", 0, joins=True))  # would give the other row ticket 5
    recorder.buffer(Transition("t2", "k", 1, "running", 1))
    recorder.flush()
    rows = {(r.task_id, r.ticket): r.status for r in KeyedTask.objects.all()}
    assert rows == {("t1", None): "waiting", ("t1", 5): "running", ("t2", 1): "running"}
    assert recorder.peek(("t1", "k", 5)) is None, "not buffered again"


def test_redaction_hook_applies_before_arguments_are_stored():
    def redact(task_name, args, kwargs):
        return args[:1], {k: "***" for k in kwargs}

    with override_settings(KEYED_QUEUE_REDACT_ARGUMENTS=redact):
        text = describe_arguments("demo.charge", ("order-1", "4111111111111111"), {"cvv": "123"})
    assert "4111" not in text and "123" not in text and "order-1" in text


def test_a_transition_survives_its_trip_through_the_gate_without_what_makes_its_row():
    """A run's outcome kept in the gate: its row is written, or its submission's record is kept beside it."""
    now = timezone.now()
    create = {"task_name": "demo.step", "args": ("k", 3), "kwargs": {}, "enqueued_at": now}
    t = Transition("t1", "k", 4, "succeeded", 2, {"finished_at": now, "error": ""}, create)
    back = Transition.from_json(t.to_json())
    assert (back.task_id, back.status, back.attempts) == ("t1", "succeeded", 2)
    assert back.submission == ("t1", "k", 4) and back.fields == {"finished_at": now, "error": ""}
    assert back.create is None and b"args" not in t.to_json(), "its arguments are not described for it"


def test_an_outcome_an_earlier_version_kept_with_its_row_s_fields_reads_back():
    kept = (
        b'{"task_id": "t1", "key": "k", "ticket": 4, "status": "succeeded", "attempts": 1, "fields": {},'
        b' "create": {"task_name": "demo.step", "arguments": "args=(1,) kwargs={}", "worker": "x"}, "joins": false}'
    )
    back = Transition.from_json(kept)
    assert back.create == {"task_name": "demo.step", "arguments": "args=(1,) kwargs={}"}


def test_a_transition_with_arguments_json_cannot_hold_goes_through_the_gate():
    """A task sent with the pickle serializer can take any object; its run must still finish."""
    create = {"task_name": "demo.step", "args": (object(),), "kwargs": {"at": {1, 2}}}
    t = Transition("t1", "k", 1, "succeeded", 1, {}, {**create, "enqueued_at": timezone.now()})
    assert Transition.from_json(t.to_json()).status == "succeeded"
    assert (
        t.row_to_create()["arguments"].startswith("args=(<object object at")
        and "{1, 2}" in t.row_to_create()["arguments"]
    )


def test_the_flusher_thread_outlives_a_database_that_fails(monkeypatch):
    written, idle_passes = [], []

    def database_down():
        idle_passes.append(1)
        raise RuntimeError("the database is down")

    monkeypatch.setattr(KeyedTask.objects, "apply", lambda *transitions, **options: written.extend(transitions) or [])
    monkeypatch.setattr(recorder_module, "close_old_connections", database_down)
    recorder = Recorder()
    with override_settings(KEYED_QUEUE_RECORD_FLUSH_SECONDS=0.01):
        recorder.buffer(Transition("t1", "k", 1, "running", 1))
        wait_until(lambda: len(idle_passes) >= 3, timeout=10, message="idle passes after a failed one")
    assert [t.task_id for t in written] == ["t1"]


def test_a_reused_task_id_has_a_row_per_submission_and_each_transition_finds_its_own():
    """Celery reuses a task id on purpose (``self.replace()``): the replaced run and its replacement."""
    make_row(status="running", attempts=1, ticket=1)
    KeyedTask.objects.insert_submission(
        task_id="t1", task_name="demo.step", key="k", ticket=2, status="waiting", arguments="", message=""
    )
    KeyedTask.objects.apply(Transition("t1", "k", 1, "ignored", 1, {"finished_at": timezone.now()}))
    KeyedTask.objects.apply(Transition("t1", "k", 2, "running", 1, {"worker": "w2"}))
    rows = {r.ticket: r for r in KeyedTask.objects.filter(task_id="t1")}
    assert (rows[1].status, rows[1].worker) == ("ignored", "")
    assert (rows[2].status, rows[2].worker) == ("running", "w2")


def test_a_join_s_run_written_before_the_join_s_waiting_record_keeps_one_row():
    """Two processes write them: the worker that joined, and the one that ran the grant."""
    make_row(status="waiting", ticket=None)
    create = {"task_name": "demo.step", "enqueued_at": timezone.now(), "args": [], "kwargs": {}}
    KeyedTask.objects.apply(Transition("t1", "k", 5, "running", 1, {"worker": "w"}, joins=True, create=create))
    KeyedTask.objects.apply(Transition("t1", "k", 5, "waiting", 0, joins=True))
    assert list(KeyedTask.objects.values_list("ticket", "status")) == [(5, "running")]


def test_a_delayed_tasks_join_finds_its_row_without_a_ticket_and_no_other():
    make_row(status="succeeded", attempts=1, ticket=1)  # an earlier submission of the same id and key
    make_row(status="waiting", ticket=None)
    KeyedTask.objects.apply(Transition("t1", "k", 5, "running", 1, {"worker": "w"}, joins=True))
    rows = {r.ticket: r.status for r in KeyedTask.objects.filter(task_id="t1")}
    assert rows == {1: "succeeded", 5: "running"}
    # Only a join may claim a row without a ticket: any other transition of an unknown ticket finds none.
    make_row(task_id="t2", status="waiting", ticket=None)
    KeyedTask.objects.apply(Transition("t2", "k", 7, "running", 1))
    assert KeyedTask.objects.get(task_id="t2").ticket is None


def test_a_worker_s_transition_waits_for_its_submission_s_row_then_makes_it(monkeypatch):
    """The submissions' writer writes the row past the record delay; a row that never comes (its record was
    lost with Redis) is made by the transition after ``create_missing_after()``."""
    monkeypatch.setattr(recorder_module, "create_missing_after", lambda: 0.3)
    create = {"task_name": "demo.step", "enqueued_at": timezone.now(), "args": ("k", 1), "kwargs": {}}
    recorder = Recorder()
    recorder._stop.set()  # no background thread: this test flushes
    recorder.buffer(Transition("t1", "k", 1, "running", 1, {"worker": "w1"}, create=create))
    recorder.buffer(Transition("t2", "k", 2, "running", 1, {"worker": "w1"}, create=create))
    make_row(task_id="t2", ticket=2, status="dispatched")  # t2's submission row is written

    recorder.flush()
    assert list(KeyedTask.objects.values_list("task_id", "status")) == [("t2", "running")]
    assert recorder.peek(("t1", "k", 1)) is not None, "t1 waits, buffered, for its row"

    make_row(task_id="t1", ticket=1, status="waiting")  # its writer's row arrives
    recorder.flush()
    assert KeyedTask.objects.get(task_id="t1").status == "running" and recorder.peek(("t1", "k", 1)) is None

    recorder.buffer(Transition("t3", "k", 3, "running", 1, {"worker": "w1"}, create=create))
    recorder.flush()
    time.sleep(0.35)
    recorder.flush()  # no row came: it makes one
    assert KeyedTask.objects.get(task_id="t3").worker == "w1"


def test_submission_rows_written_in_one_batch_merge_with_rows_a_worker_made_first():
    """The submissions' writer inserts a batch at once; where a worker's row came first, that row keeps
    its status, and no row is doubled."""
    enqueued = timezone.now() - timedelta(seconds=3)
    create = {"task_name": "demo.step", "enqueued_at": enqueued, "arguments": "args=('k',)"}
    make_row(task_id="t2", ticket=2, status="running", attempts=1, arguments="args=('k',)", worker="w1")
    rows = [Transition(f"t{i}", "k", i, "waiting", 0, create=create) for i in (1, 2, 3)]
    KeyedTask.objects.apply(*rows, new=True)
    found = {r.task_id: (r.status, r.attempts, r.worker, r.enqueued_at) for r in KeyedTask.objects.all()}
    assert found == {
        "t1": ("waiting", 0, "", enqueued),
        "t2": ("running", 1, "w1", found["t2"][3]),
        "t3": ("waiting", 0, "", enqueued),
    }
    KeyedTask.objects.apply(*rows, new=True)  # written again (a writer's claim ran out): no change, no new row
    assert KeyedTask.objects.count() == 3
    assert {r.task_id: (r.status, r.attempts, r.worker, r.enqueued_at) for r in KeyedTask.objects.all()} == found


HOSTILE = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(), st.text(min_size=5000),
    st.just("\x00"), st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
)  # fmt: skip
KEPT_NAMES = ("task_id", "key", "ticket", "status", "attempts", "fields", "joins", "create")


@settings(max_examples=300, deadline=None)
@given(
    data=st.one_of(
        st.fixed_dictionaries({}, optional={name: HOSTILE for name in KEPT_NAMES}),
        st.fixed_dictionaries(
            {
                "task_id": st.just("t1"),
                "key": st.just("k"),
                "ticket": st.just(1),
                "status": st.just("failed"),
                "attempts": st.just(1),
            },
            optional={
                "fields": st.dictionaries(st.sampled_from(FIELDS), HOSTILE, max_size=4),
                "create": st.dictionaries(st.sampled_from(CREATE_FIELDS), HOSTILE, max_size=3),
            },
        ),  # fmt: skip
        HOSTILE,
    ),
    raw=st.binary(max_size=64),
)
def test_an_outcome_read_back_from_the_gate_is_a_transition_of_its_fields_types_or_refused_by_name(data, raw):
    """The gate's Redis may hold anything under a kept outcome (the reaper and a task's page read it back):
    it decodes to a transition whose every value has its column's type, or ValueError; nothing else."""
    for kept in (kombu_json(data).encode(), raw):
        try:
            t = Transition.from_json(kept)
        except ValueError:
            continue
        assert isinstance(t.task_id, str) and isinstance(t.key, str) and isinstance(t.ticket, int)
        assert isinstance(t.attempts, int) and t.status in STATUS_RANK
        for name, value in {**t.fields, **(t.create or {})}.items():
            nullable = name.endswith("_at") and name != "enqueued_at"  # as the row's columns
            assert isinstance(value, datetime if name.endswith("_at") else str) or (nullable and value is None), name
