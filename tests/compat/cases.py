"""The compatibility tier's cases (the plain task, its keyed twin, the twin behind a busy key), holding a key,
the journal's events, and the key's checks."""

from __future__ import annotations

import pytest

from django_keyed_queue.records.models import KeyedTask
from testproject.compat import journal
from testproject.history_checks import by_id, check_serial
from tests.waiting import wait_until

#: Every module of the tier: real workers, records written by them, and out of the default run.
MARKS = [pytest.mark.compat, pytest.mark.workers, pytest.mark.django_db(transaction=True)]


#: The three cases of a behaviour: the plain task, its keyed twin with its key free, and its keyed
#: twin submitted while its key is busy (it waits in the gate, and usually runs by local handoff).
PLAIN, KEYED, WAITED = "plain", "keyed", "keyed-waited"

#: The queue of the tier's own worker, which sends task events (-E) and runs one task at a time.
EVENTS_QUEUE = "compat-events"


def kinds(keyed: str | None = None, waited: str | None = None, *, wait: bool = True):
    """Run the test on the plain task and on its keyed twin (``kind``), also behind a busy key unless not ``wait``.

    ``keyed`` and ``waited`` say what breaks in that case: it is a strict xfail
    (never the plain case), so the fix makes it XPASS and fail the run.
    """
    params = [PLAIN, _case(KEYED, keyed)]
    if wait:
        params.append(_case(WAITED, waited))
    return pytest.mark.parametrize("kind", params)


def keyed_only(keyed: str | None = None, waited: str | None = None, *, free: bool = True):
    """A behaviour only keyed tasks have (a task waiting for its key): no plain case."""
    return pytest.mark.parametrize("kind", ([_case(KEYED, keyed)] if free else []) + [_case(WAITED, waited)])


def _case(kind: str, broken: str | None):
    if broken is None:
        return kind
    return pytest.param(kind, marks=pytest.mark.xfail(strict=True, reason=f"issue 12: {broken}"))


def hold_key(kind: str, key: str, seconds: float = 0.2, queue: str = "celery"):
    """In the ``keyed-waited`` case, run a task holding ``key`` for ``seconds``; the task under test waits for it.

    Returns once that task runs (None in the other cases), so that whatever the
    test submits next finds the key busy with a running task. Give the queue the
    task under test goes to: the worker that frees the key then runs it itself.
    """
    if kind != WAITED:
        return None
    from testproject.compat.tasks import sleeper

    holder = sleeper(KEYED).apply_async((seconds,), {"key": key}, queue=queue)
    wait_until(lambda: holder.id in starts(key), 10, 0.02, f"the task holding {key} to start")
    return holder


def events(key: str, name: str | None = None) -> list[dict]:
    """The journal's events of ``key`` (only those called ``name`` if given)."""
    return [e for e in journal.read() if e.get("key") == key and (name is None or e["event"] == name)]


def journal_has(event: str, task_id: str) -> dict | None:
    """The journal's first ``event`` of task ``task_id``, if any."""
    return next((e for e in journal.read() if e["event"] == event and e.get("id") == task_id), None)


def starts(key: str) -> list[str | None]:
    """The task ids of the body runs of ``key``, in the order they started."""
    return [e["id"] for e in events(key, "start")]


def check_key(kind: str, key: str, order: list[str] | None = None) -> None:
    """On a keyed run: the body runs of ``key`` never overlapped and, given ``order`` (task ids), first started
    in it (testproject/history_checks.py; a run is a task id in a process)."""
    if kind == PLAIN:
        return
    history = events(key)
    serial = check_serial(history, ident=by_id, run=run_of)  # no order but the given one: the holder runs first
    assert not serial.problems, f"runs of {key}: {serial.problems}; its events: {history}"
    if order is not None:
        started = [i for i in serial.first_starts.get(key, []) if i in order]
        assert started == order, f"{key} started {started}, not in the order {order}"


def run_of(event: dict) -> tuple[str | None, int]:
    """A body run: its task id (None for a direct call) and its process."""
    return event.get("id"), event["pid"]


def worker_log(workers) -> str:
    """Every given worker's log, as written so far."""
    return "".join(worker.log() for worker in workers)


def record(task_id: str) -> KeyedTask | None:
    """The task's latest record (Celery may submit one task id more than once, each with a row)."""
    return KeyedTask.objects.filter(task_id=task_id).first()


def wait_for_record(task_id: str, status: str, timeout: float = 15) -> KeyedTask:
    def reached():
        row = KeyedTask.objects.filter(task_id=task_id).first()
        return row if row is not None and row.status == status else None

    return wait_until(reached, timeout, 0.1, f"the record of {task_id} to be {status}")
