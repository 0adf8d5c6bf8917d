"""Which task each pool process runs by local handoff, told to the worker's main process.

A task run by local handoff runs inside the pool job of the task that freed
its key (its host), so Celery's main process knows only the host. Each pool
process notes the task it runs that way in memory the main process shared
before it forked the pool (one entry per pool process index). With it the main
process can:

- kill a task run by local handoff that is revoked with ``terminate=True``
  (``terminate``), as Celery kills a task that came by message, and announce
  it revoked as Celery would;
- tell that a host job lost with its process had finished its own task
  (``hosted_by``): the host succeeded or failed before, and its result stands.
"""

from __future__ import annotations

import json
import logging
import mmap
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from billiard.process import current_process
from celery import signals
from celery.app.task import Context

from ..messaging.message import HEADER

if TYPE_CHECKING:
    from celery import Celery
    from celery.worker.consumer import Consumer

logger = logging.getLogger(__name__)

#: Bytes of one pool process's entry (a key is at most 200 characters, up to 800 bytes).
ENTRY_BYTES = 2048

_memory: mmap.mmap | None = None


def share(processes: int) -> None:
    """In the worker's main process, before it forks its pool of at most ``processes``."""
    global _memory
    _memory = mmap.mmap(-1, max(processes, 1) * ENTRY_BYTES)


def note(host_id: str, request: dict[str, Any]) -> None:
    """In a pool process: it runs ``request`` by local handoff, inside the job of ``host_id``."""
    entry = {"pid": current_process().pid, "host": host_id, "id": request["id"], "task": request["task"]}
    _write({**entry, HEADER: request[HEADER]})


def clear() -> None:
    """In a pool process: it runs nothing by local handoff any more."""
    _write(None)


def hosted_by(task_id: str, pid: object) -> dict[str, Any] | None:
    """The run by local handoff that the job of ``task_id`` in process ``pid`` hosted last, if it hosted one.

    (The entry of a process that died stays until its index is reused; its pid keeps it from
    matching a later job of the same task id.)
    """
    return next((entry for entry in _entries() if entry["host"] == task_id and entry["pid"] == pid), None)


def terminate(app: Celery, consumer: Consumer, task_ids: Iterable[str], signum: int) -> list[str]:
    """``revoke(terminate=True)`` in the worker's main process: kill the pool processes that run any of
    ``task_ids`` by local handoff, and announce each revoked as Celery does; the ids killed."""
    ids = set(task_ids)
    processes = set(consumer.pool.info.get("processes") or ())
    killed = []
    for entry in _entries():
        if entry["id"] not in ids or entry["pid"] not in processes:
            continue
        logger.info("Terminating %s (%s), run by local handoff in process %s", entry["id"], signum, entry["pid"])
        consumer.pool.terminate_job(entry["pid"], signum)
        killed.append(entry["id"])
        _announce_terminated(app, consumer, entry, signum)
    return killed


def _announce_terminated(app: Celery, consumer: Consumer, entry: dict[str, Any], signum: int) -> None:
    """What Celery's request does for a task it terminated: its result, the event, ``task_revoked``."""
    task = app.tasks.get(entry["task"])
    request = Context({"id": entry["id"], "task": entry["task"], HEADER: entry[HEADER], "worker_pid": entry["pid"]})
    backend = task.backend if task is not None else app.backend
    backend.mark_as_revoked(entry["id"], "terminated", request=request)
    # The consumer's Events step sets event_dispatcher; celery-types' Consumer leaves it out.
    if consumer.event_dispatcher is not None and consumer.event_dispatcher.enabled:  # type: ignore[attr-defined]
        consumer.event_dispatcher.send(  # type: ignore[attr-defined]
            "task-revoked", uuid=entry["id"], terminated=True, signum=signum, expired=False
        )
    signals.task_revoked.send(sender=task, request=request, terminated=True, signum=signum, expired=False)


def _slot() -> int | None:
    index: int | None = getattr(current_process(), "index", None)
    if _memory is None or index is None or (index + 1) * ENTRY_BYTES > len(_memory):
        return None
    return index * ENTRY_BYTES


def _write(entry: dict[str, Any] | None) -> None:
    offset = _slot()
    if offset is None or _memory is None:
        return
    data = b"" if entry is None else json.dumps(entry).encode()
    if len(data) > ENTRY_BYTES:
        return
    _memory[offset : offset + ENTRY_BYTES] = data.ljust(ENTRY_BYTES, b"\0")


def _entries() -> Iterator[dict[str, Any]]:
    """Every pool process's entry; one being written as it is read is skipped, as if empty."""
    if _memory is None:
        return
    for offset in range(0, len(_memory), ENTRY_BYTES):
        data = _memory[offset : offset + ENTRY_BYTES].rstrip(b"\0")
        if not data:
            continue
        try:
            entry = json.loads(data)
        except ValueError:
            continue
        if isinstance(entry, dict) and {"pid", "host", "id", "task", HEADER} <= set(entry):
            yield entry
