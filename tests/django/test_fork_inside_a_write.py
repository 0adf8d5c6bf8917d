"""A process forked while another thread writes records can write its own (records/forks.py): Celery's
prefork worker forks pool processes from its main process, whose threads write records."""

from __future__ import annotations

import os
import threading

import pytest
from django.db import connections
from django.utils import timezone

from django_keyed_queue.records.models import KeyedTask
from django_keyed_queue.records.transitions import Transition

pytestmark = pytest.mark.django_db(transaction=True)


def _written_in_a_child(task_id: str) -> int:
    """Fork; the child writes a record of ``task_id`` (waiting at most 2 s for a lock); its exit code."""
    pid = os.fork()
    if pid == 0:  # the child: nothing of the test runs on in it
        code = 1
        try:
            for conn in connections.all(initialized_only=True):
                conn.connection = None  # the parent's: dropped, not closed under it
            create = {"task_name": "demo.step", "args": ("k", 1), "kwargs": {}, "enqueued_at": timezone.now()}
            KeyedTask.objects.apply(Transition(task_id, "k", 2, "running", 1, {}, create), lock_wait=2)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_a_process_forked_while_another_thread_writes_a_record_writes_its_own():
    if connections[KeyedTask.objects.db_for_write()].vendor != "sqlite":
        pytest.skip("a SQLite lock is what a fork copies")
    inside, leave = threading.Event(), threading.Event()

    def paused_after_the_first_write(execute, sql, params, many, context):
        done = execute(sql, params, many, context)
        if not inside.is_set() and sql.lstrip().upper().startswith(("INSERT", "UPDATE")):
            inside.set()  # inside apply's transaction, its lock taken
            leave.wait(10)
        return done

    def write_slowly() -> None:
        db = connections[KeyedTask.objects.db_for_write()]
        try:
            with db.execute_wrapper(paused_after_the_first_write):
                create = {"task_name": "demo.step", "args": ("k", 1), "kwargs": {}, "enqueued_at": timezone.now()}
                KeyedTask.objects.apply(Transition("parent", "k", 1, "running", 1, {}, create))
        finally:
            connections.close_all()

    writer = threading.Thread(target=write_slowly)
    writer.start()
    assert inside.wait(10), "the writer to be inside its transaction"
    threading.Timer(0.5, leave.set).start()  # the fork waits for the write to end
    assert _written_in_a_child("child") == 0, "the child could not write"
    writer.join(10)
    assert set(KeyedTask.objects.values_list("task_id", flat=True)) == {"parent", "child"}
