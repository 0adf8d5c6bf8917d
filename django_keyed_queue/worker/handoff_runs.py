"""Which task each child process runs by local handoff, told to the worker's main process.

A task run by local handoff runs inside the job of the task that freed
its key (its host), so Celery's main process knows only the host. Each pool
process notes the task it runs that way in memory the main process shared
before it forked the pool (one entry per child process index). With it the main
process can:

- kill a task run by local handoff that is revoked with ``terminate=True``
  (``terminate``), as Celery kills a task that came by message, and announce
  it revoked as Celery would;
- tell that a host job lost with its process had finished its own task
  (``hosted_by``): the host succeeded or failed before, and its result stands;
- leave a host whose task has ended alone when it is revoked with ``terminate``
  (or stopped): the revoke names a task that has ended, and changes nothing;
- tell Celery's ``inspect active`` the run executing in the job (``shown``), not
  the task that ended.

An entry is written as soon as the host's finish keeps the grant, before the run
starts, and again when it starts.

The main process also shares the task ids Celery revoked at this worker (the last
``REVOKED_SLOTS`` of them): a child process looks there before it runs a kept grant,
as Celery's main process looks in its revoked ids before it sends a message to the
pool, so a task revoked while it waited never runs here either.
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

#: Bytes of one child process's entry (a key is at most 200 characters, up to 800 bytes).
ENTRY_BYTES = 2048
#: Characters of a run's arguments' repr its entry keeps for ``inspect active`` (shortened to fit).
SHOWN_CHARS = 300

#: How many of the latest revoked task ids the child processes see, and the bytes each may take.
REVOKED_SLOTS = 512
REVOKED_BYTES = 256
#: The revoked ids' count, then their slots: a revoked id is written as MARK + id + b"\0".
_COUNT_BYTES = 8
MARK = b"\x01"

_memory: mmap.mmap | None = None
_revoked: mmap.mmap | None = None
#: One byte: whether the worker sends task events now (its -E, or Celery's enable_events since).
_task_events: mmap.mmap | None = None
#: Per child process index: how many runs it ran by local handoff, by task name (JSON), for Celery's stats.
COUNTS_BYTES = 4096
_counts: mmap.mmap | None = None
#: This process's counts, as its slot has them (a process that took the index of one gone goes on).
_counted: dict[str, int] | None = None


def share(processes: int, *, task_events: bool = False) -> None:
    """In the worker's main process, before it forks its pool of at most ``processes``."""
    global _memory, _revoked, _task_events, _counts
    _memory = mmap.mmap(-1, max(processes, 1) * ENTRY_BYTES)
    _revoked = mmap.mmap(-1, _COUNT_BYTES + REVOKED_SLOTS * REVOKED_BYTES)
    _task_events = mmap.mmap(-1, 1)
    _counts = mmap.mmap(-1, max(processes, 1) * COUNTS_BYTES)
    set_task_events(task_events)


def count_run(task_name: str) -> None:
    """In a child process: it runs one more task ``task_name`` by local handoff (Celery's ``inspect stats``
    counts it in the worker's ``total``, as the main process counts a message's)."""
    global _counted
    index: int | None = getattr(current_process(), "index", None)
    if _counts is None or index is None or (index + 1) * COUNTS_BYTES > len(_counts):
        return
    offset = index * COUNTS_BYTES
    if _counted is None:
        _counted = _counts_in(_counts[offset : offset + COUNTS_BYTES])
    _counted[task_name] = _counted.get(task_name, 0) + 1
    data = json.dumps(_counted).encode()
    if len(data) <= COUNTS_BYTES:  # a process of many task names counts those that fit
        _counts[offset : offset + COUNTS_BYTES] = data.ljust(COUNTS_BYTES, b"\0")


def forget_counted() -> None:
    """In a process just forked: its counts are read again from its own slot when it first counts."""
    global _counted
    _counted = None


def handed_off_totals() -> dict[str, int]:
    """In the worker's main process: the runs its child processes ran by local handoff, by task name."""
    totals: dict[str, int] = {}
    if _counts is None:
        return totals
    for offset in range(0, len(_counts), COUNTS_BYTES):
        for name, n in _counts_in(_counts[offset : offset + COUNTS_BYTES]).items():
            totals[name] = totals.get(name, 0) + n
    return totals


def _counts_in(data: bytes) -> dict[str, int]:
    parsed = _parsed(data.rstrip(b"\0")) if data.strip(b"\0") else None
    return {k: v for k, v in (parsed or {}).items() if isinstance(k, str) and isinstance(v, int)}


def set_task_events(enabled: bool) -> None:
    """In the worker's main process: it sends task events from now on, or no longer (Celery's
    ``enable_events`` and ``disable_events`` control commands); its child processes send those of the runs
    they run by local handoff alike."""
    if _task_events is not None:
        _task_events[0] = int(enabled)


def task_events(default: bool) -> bool:
    """In a child process: whether its worker sends task events now (``default`` where nothing is shared)."""
    return default if _task_events is None else bool(_task_events[0])


def revoke(task_ids: Iterable[str]) -> None:
    """In the worker's main process: Celery revoked ``task_ids`` here; its child processes see it from now."""
    if _revoked is None:
        return
    count = int.from_bytes(_revoked[:_COUNT_BYTES], "little")
    for task_id in task_ids:
        written = MARK + str(task_id).encode() + b"\0"
        if len(written) > REVOKED_BYTES:
            logger.warning("revoked task id %.80r... is too long for the child processes to see it", task_id)
            continue
        offset = _COUNT_BYTES + (count % REVOKED_SLOTS) * REVOKED_BYTES
        _revoked[offset : offset + REVOKED_BYTES] = written.ljust(REVOKED_BYTES, b"\0")
        count += 1
    _revoked[:_COUNT_BYTES] = count.to_bytes(_COUNT_BYTES, "little")  # after the ids it counts


def revoked(task_id: str) -> bool:
    """In a child process: whether Celery revoked ``task_id`` at this worker (among the latest it revoked)."""
    if _revoked is None or not any(_revoked[:_COUNT_BYTES]):
        return False  # nothing was revoked here: no search
    return _revoked.find(MARK + task_id.encode() + b"\0", _COUNT_BYTES) >= 0


def note(host_id: str, request: dict[str, Any], *, started: float | None = None) -> None:
    """In a child process: it runs ``request`` by local handoff, inside the job of ``host_id`` (kept to run
    next, or ``started`` at that time)."""
    entry = {"pid": current_process().pid, "host": host_id, "id": request["id"], "task": request["task"]}
    entry.update({HEADER: request[HEADER], "time_start": started})
    shown = {name: str(request.get(name) or "")[:SHOWN_CHARS] for name in ("argsrepr", "kwargsrepr")}
    if not _write({**entry, **shown}):
        _write(entry)  # its arguments shown as unknown, never the run left out


def clear(host_id: str = "", *, announced: bool = False) -> None:
    """In a child process: it runs nothing by local handoff any more. ``announced``: the task ``host_id``,
    whose job it was, had its end's event sent from here already (``announced``)."""
    _write({"pid": current_process().pid, "host": host_id, "announced": True} if announced else None)


def announced(task_id: str, pid: object) -> bool:
    """Whether the job of ``task_id`` in process ``pid`` sent its task's end event itself, when its task
    ended and before the runs it hosted by local handoff: the main process sends none at the job's end."""
    entry = _entry_of(pid)
    return entry is not None and entry.get("host") == task_id and entry.get("announced") is True


def hosted_by(task_id: str, pid: object) -> dict[str, Any] | None:
    """The run by local handoff that the job of ``task_id`` in process ``pid`` hosted last, if it hosted one.

    (The entry of a process that died stays until its index is reused; its pid keeps it from
    matching a later job of the same task id.)
    """
    return next((entry for entry in _entries() if entry["host"] == task_id and entry["pid"] == pid), None)


def _entry_of(pid: object) -> dict[str, Any] | None:
    """The entry of process ``pid``, whatever it says (a run it hosts, or an announced end)."""
    for data in _raw_entries():
        entry = _parsed(data)
        if entry is not None and entry.get("pid") == pid:
            return entry
    return None


def shown(hosted: dict[str, Any], info: dict[str, Any]) -> dict[str, Any]:
    """Celery's ``inspect active`` entry of a host job (``info``: its request's), as the run it hosts."""
    args, kwargs = hosted.get("argsrepr"), hosted.get("kwargsrepr")
    return {
        **info,
        "id": hosted["id"],
        "name": hosted["task"],
        "args": args if isinstance(args, str) else "",
        "kwargs": kwargs if isinstance(kwargs, str) else "",
        "type": hosted["task"],
        "time_start": hosted.get("time_start"),
        "hosted_by": info["id"],
    }


def terminate(app: Celery, consumer: Consumer, task_ids: Iterable[str], signum: int) -> list[str]:
    """``revoke(terminate=True)`` in the worker's main process: kill the child processes that run any of
    ``task_ids`` by local handoff, and announce each revoked as Celery does; the ids killed."""
    ids = set(task_ids)
    processes = set(consumer.pool.info.get("processes") or ())
    killed = []
    for entry in _entries():
        if entry["id"] not in ids or entry["pid"] not in processes:
            continue
        if entry.get("time_start") is None:
            continue  # kept, not started: it sees itself revoked and never starts (``revoked``)
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


def _write(entry: dict[str, Any] | None) -> bool:
    """Write this process's entry (None: clear it); False if it does not fit."""
    offset = _slot()
    if offset is None or _memory is None:
        return True
    data = b"" if entry is None else json.dumps(entry).encode()
    if len(data) > ENTRY_BYTES:
        return False
    _memory[offset : offset + ENTRY_BYTES] = data.ljust(ENTRY_BYTES, b"\0")
    return True


def _entries() -> Iterator[dict[str, Any]]:
    """Every child process's entry of a run it hosts; one being written as it is read is skipped, as if empty."""
    for data in _raw_entries():
        entry = _parsed(data)
        if entry is not None and {"pid", "host", "id", "task", HEADER} <= set(entry):
            yield entry


def _raw_entries() -> Iterator[bytes]:
    if _memory is None:
        return
    for offset in range(0, len(_memory), ENTRY_BYTES):
        data = _memory[offset : offset + ENTRY_BYTES].rstrip(b"\0")
        if data:
            yield data


def _parsed(data: bytes) -> dict[str, Any] | None:
    try:
        entry = json.loads(data)
    except ValueError:
        return None
    return entry if isinstance(entry, dict) else None
