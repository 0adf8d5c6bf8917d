"""A process forked while another thread uses the database can write its own records (records/forks.py):
Celery's prefork worker forks child processes from its main process, whose threads write records."""

from __future__ import annotations

import os
import select
import signal
import threading
import time
import traceback

import pytest
from django.db import connections
from django.test import override_settings
from django.utils import timezone

from django_keyed_queue.records import forks
from django_keyed_queue.records.models import KeyedTask
from django_keyed_queue.records.recorder import Recorder
from django_keyed_queue.records.transitions import Transition

pytestmark = pytest.mark.django_db(transaction=True)

#: How long a child may take to write its record before it counts as hung.
CHILD_SECONDS = 15.0


def _create(ticket: int) -> dict:
    return {"task_name": "demo.step", "args": ("k", ticket), "kwargs": {}, "enqueued_at": timezone.now()}


def _written_in_a_child(task_id: str, ticket: int) -> str:
    """Fork; the child writes a record of ``task_id`` (waiting at most 2 s for a lock); what it failed on
    ("" if nothing)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: nothing of the test runs on in it
        os.close(read_end)
        failure = "it ended before it said"
        try:
            for conn in connections.all(initialized_only=True):
                conn.close()  # the copies of this thread's own, as Celery's Django fixup closes them
            KeyedTask.objects.apply(Transition(task_id, "k", ticket, "running", 1, {}, _create(ticket)), lock_wait=2)
            failure = ""
        except BaseException:
            failure = traceback.format_exc()
        finally:
            os.write(write_end, failure.encode())
            os._exit(0)
    os.close(write_end)
    try:
        if not select.select([read_end], [], [], CHILD_SECONDS)[0]:
            os.kill(pid, signal.SIGKILL)
            return f"the child hung for {CHILD_SECONDS:.0f} s"
        with os.fdopen(read_end, "rb", closefd=False) as said:
            return said.read().decode()
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)


def test_a_fork_waits_for_another_threads_write_and_the_child_writes_its_own():
    inside, leave = threading.Event(), threading.Event()

    def paused_after_the_first_write(execute, sql, params, many, context):
        done = execute(sql, params, many, context)
        if not inside.is_set() and sql.lstrip().upper().startswith(("INSERT", "UPDATE")):
            inside.set()  # inside apply's transaction, its lock taken
            leave.wait(10)
        return done

    def write_slowly() -> None:
        db = connections[KeyedTask.objects.db_for_write()]
        with forks.held_off():  # as each of the package's threads holds it around its pass
            try:
                with db.execute_wrapper(paused_after_the_first_write):
                    KeyedTask.objects.apply(Transition("parent", "k", 1, "running", 1, {}, _create(1)))
            finally:
                connections.close_all()

    writer = threading.Thread(target=write_slowly)
    writer.start()
    assert inside.wait(10), "the writer to be inside its transaction"
    threading.Timer(0.5, leave.set).start()  # the fork waits for the write to end
    assert _written_in_a_child("child", 2) == ""
    writer.join(10)
    assert set(KeyedTask.objects.values_list("task_id", flat=True)) == {"parent", "child"}


def test_processes_forked_while_the_recorders_thread_writes_each_write_their_own():
    """The recorder's own thread writing rows, opening and closing its connection, as a worker's main process
    forks child processes: a fork that caught it inside SQLite left a child that could not write, or hung;
    one that copied its open connection (WAL) left a child whose writes were lost."""
    recorder, stop = Recorder(), threading.Event()
    connections.close_all()  # none of the forking thread's own: the recorder's may be the parent's only one

    def buffer_steadily() -> None:
        ticket = 1000
        while not stop.is_set():
            ticket += 1
            recorder.buffer(
                Transition(f"busy-{ticket}", "k", ticket, "running", 1, {}, _create(ticket), insert_first=True)
            )
            time.sleep(0.001 * (ticket % 4))  # now and then idle: the thread closes its connection

    with override_settings(KEYED_QUEUE_RECORD_FLUSH_SECONDS=0.002):
        feeder = threading.Thread(target=buffer_steadily)
        feeder.start()
        try:
            failures = [failure for n in range(40) if (failure := _written_in_a_child(f"child-{n}", 1 + n))]
        finally:
            stop.set()
            feeder.join(10)
            recorder.close()
    assert failures == []
    assert sorted(KeyedTask.objects.filter(task_id__startswith="child-").values_list("ticket", flat=True)) == list(
        range(1, 41)
    ), "a child's write was lost"
    assert KeyedTask.objects.filter(task_id__startswith="busy-").count() > 40, "the recorder wrote meanwhile"
