"""The keys' later words the admin's search reads (``records.key_words``): written with a key's first
row, once per process, by every writer that makes rows; never at the cost of a record."""

from __future__ import annotations

import logging

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_keyed_queue.records import key_words, queries
from django_keyed_queue.records.models import KeyedTask, KeyWord
from django_keyed_queue.records.statuses import Status
from django_keyed_queue.records.transitions import Transition
from django_keyed_queue.testing import write_submission_rows
from testproject.demo.tasks import step
from tests.django.queues import QUEUE

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _no_key_known():
    key_words.KNOWN.clear()
    yield
    key_words.KNOWN.clear()


def words() -> set[tuple[str, str]]:
    return set(KeyWord.objects.values_list("word", "key"))


def made(task_id: str, key: str) -> Transition:
    create = {"task_name": step.name, "enqueued_at": timezone.now(), "arguments": ""}
    return Transition(task_id, key, 1, Status.WAITING, 0, create=create)


@pytest.mark.parametrize(
    ("key", "later"),
    [
        ("ledger:1001", ["1001"]),
        ("tenant:5:ledger:1001", ["1001", "5", "ledger"]),
        ("report", []),
        (" lead:1", ["1", "lead"]),  # its start is the empty text before the space
        ("a::b", ["b"]),
        ("x:x", ["x"]),
        ("café/№7", ["№7"]),
        ("a%b_c\\d", ["c\\d"]),  # % and \ are not separators
    ],
)
def test_the_later_words_of_a_key(key, later):
    assert key_words.later_words(key) == later


def test_the_submissions_writer_writes_a_new_keys_words_with_its_rows(gate_redis, broker):
    for n in range(3):
        step.apply_async((f"ledger:{n}:eu", n), queue=QUEUE)
    step.apply_async(("report", 9), queue=QUEUE)
    assert write_submission_rows() == 4
    assert words() == {(w, f"ledger:{n}:eu") for n in range(3) for w in (str(n), "eu")}


def test_a_delayed_submission_writes_its_keys_words_with_its_row(gate_redis, broker):
    step.apply_async(("ledger:7", 1), queue=QUEUE, countdown=3600)
    assert KeyedTask.objects.filter(key="ledger:7", status=Status.WAITING).exists()
    assert words() == {("7", "ledger:7")}


def test_a_key_is_written_once_per_process_once_its_words_commit(django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        KeyedTask.objects.apply(made("t1", "order:1"), made("t2", "order:2"), new=True)
    with CaptureQueriesContext(connection) as captured, django_capture_on_commit_callbacks(execute=True):
        KeyedTask.objects.apply(made("t3", "order:1"), made("t4", "order:3"), new=True)
    written = [q["sql"] for q in captured.captured_queries if KeyWord._meta.db_table in q["sql"]]
    assert len(written) == 1 and "order:1" not in str(written), "order:1's words were written by the first batch"
    assert words() == {("1", "order:1"), ("2", "order:2"), ("3", "order:3")}


def test_many_new_keys_words_are_written_a_statement_per_few_hundred(monkeypatch):
    monkeypatch.setattr(key_words, "ROWS_PER_INSERT", 2)
    with CaptureQueriesContext(connection) as captured:
        KeyedTask.objects.apply(*(made(f"t{n}", f"order:{n}:eu") for n in range(3)), new=True)
    assert len([q for q in captured.captured_queries if KeyWord._meta.db_table in q["sql"]]) == 3  # 6 rows, 2 each
    assert words() == {(w, f"order:{n}:eu") for n in range(3) for w in (str(n), "eu")}


def test_words_rolled_back_with_their_rows_are_written_again(django_capture_on_commit_callbacks):
    with pytest.raises(RuntimeError), transaction.atomic():
        KeyedTask.objects.apply(made("t1", "order:1"), new=True)
        raise RuntimeError("the caller's transaction fails")
    assert not words() and key_words.KNOWN.missing(connection.alias, ["order:1"]) == ["order:1"]
    with django_capture_on_commit_callbacks(execute=True):
        KeyedTask.objects.apply(made("t1", "order:1"), new=True)
    assert words() == {("1", "order:1")}


def test_words_the_database_refuses_hold_back_no_record(monkeypatch, caplog, django_capture_on_commit_callbacks):
    refused = "INSERT INTO no_such_table (word, key) VALUES "
    monkeypatch.setattr(queries, "key_words_insert_sql", lambda alias, rows: refused + ", ".join(["(%s, %s)"] * rows))
    with caplog.at_level(logging.WARNING), django_capture_on_commit_callbacks(execute=True):
        KeyedTask.objects.apply(made("t1", "order:1"), made("t2", "order:2"), new=True)
    assert KeyedTask.objects.filter(task_id__in=["t1", "t2"]).count() == 2 and not words()
    assert "were not written for the search" in caplog.text
    assert key_words.KNOWN.missing(connection.alias, ["order:1"]) == ["order:1"], "tried again with its next row"
