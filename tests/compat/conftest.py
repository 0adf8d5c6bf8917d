"""The compatibility tier: Celery's documented task behaviours, on plain tasks and their keyed twins.

Each test runs twice, on the plain ``shared_task`` and on its keyed twin (see
``testproject/compat/tasks.py``), on the session's real workers, and asserts
what a user observes (states, results, logs, signals, events) the same way for
both; on keyed runs it also checks the key's guarantees. A behaviour that is
broken for keyed tasks only has its keyed case marked
``xfail(strict=True, reason="issue 12: ...")``: the fix turns it into a failure
(XPASS) until the marker goes. Run it with ``pytest -m compat tests/compat``.
"""

from __future__ import annotations

import os
import threading
import uuid
from contextlib import suppress
from pathlib import Path

import pytest

from testproject.servers import QUIET_WORKER_ARGS, Worker
from tests.compat.cases import EVENTS_QUEUE
from tests.waiting import wait_until


@pytest.fixture
def key(gate_redis) -> str:
    """A key of this test alone: the keyed tasks of one test share it (and the gate and journal are empty)."""
    return f"compat-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session")
def events_worker(workers) -> Worker:
    """A worker with task events on (``celery worker -E``), concurrency 1, alone on ``EVENTS_QUEUE``.

    Started once, after the session's workers, and stopped at the end of the session.
    """
    worker = Worker(
        "compat-events",
        Path(os.environ["TESTPROJECT_DATA_DIR"]) / "logs",
        concurrency=1,
        queues=EVENTS_QUEUE,
        args=(*QUIET_WORKER_ARGS, "-E"),
        extra_env={"KEYED_QUEUE_LOCAL_HANDOFF_SECONDS": "2"},
    )
    worker.start()
    yield worker
    worker.kill()


@pytest.fixture(scope="session")
def task_events(events_worker) -> list[dict]:
    """Every event the tier's events worker sends from now on, in arrival order (a list that grows).

    Captured by an event receiver in a thread; it is consuming before the
    fixture returns (a probe event it sent itself came back).
    """
    from testproject.celery import app

    captured: list[dict] = []
    connection = app.connection_for_read()
    receiver = app.events.Receiver(connection, handlers={"*": captured.append})

    def capture() -> None:
        with suppress(Exception):  # the connection closes under it at the end
            receiver.capture(limit=None, timeout=None, wakeup=False)

    thread = threading.Thread(target=capture, name="compat-task-events", daemon=True)
    thread.start()
    probe = uuid.uuid4().hex
    with app.events.default_dispatcher(hostname="compat-probe") as dispatcher:

        def probed() -> bool:
            dispatcher.send("compat-probe", uuid=probe)
            return any(e.get("uuid") == probe for e in captured)

        wait_until(probed, 10, 0.2, "the event receiver to consume")
    yield captured
    receiver.should_stop = True
    thread.join(10)
    connection.release()
