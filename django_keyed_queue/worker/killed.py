"""A run Celery kills on purpose ends when its process has ended, never before.

Celery kills a running task's child process when the task is revoked with ``terminate`` (an
operator's Stop sends that revoke, to the worker that runs it) or passes its hard time limit,
from the worker's main process, which knows the message it killed and so the attempt: its
ticket header. That attempt is stopped at the gate at once (``Gate.stop``: it is not recovered,
and it keeps its key's slot), and the main process watches the child process: once it is gone,
that dispatch is released, its task's record ends naming who stopped it, and its key's next
task goes out. A process that outlives the signal goes on renewing its lease, and its key stays
held; one that is never seen to end (its worker died too) is ended by its lease's end, by the
reaper. The key's next task never starts beside it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import connections

from ..conf import settings
from ..messaging.recovered import carry_out
from ..process.state import current, worker_gate
from ..records import forks

if TYPE_CHECKING:
    from celery import Celery

logger = logging.getLogger(__name__)

#: How often the main process looks whether a killed run's process is gone.
WATCH_SECONDS = 0.05

#: Runs Celery is killing for a revoke with terminate, noted by the request (``request``): task id -> process.
terminating: dict[str, object] = {}


@dataclass(frozen=True)
class _Watched:
    """A killed run this main process watches end: its attempt, its process and that process's start."""

    key: str
    ticket: int
    dispatch: int
    pid: int
    started: str

    def runs(self) -> bool:
        """Its process is the one killed and alive, and its attempt still holds its key: a child process
        that went on to run other tasks (the run ignored the signal and ended) is never signalled again."""
        if _process_start(self.pid) != self.started:
            return False
        holder = worker_gate().inspect(self.key, waiting_shown=0).holders.get(self.ticket)
        return holder is not None and holder.state == "running" and holder.dispatch == self.dispatch


#: The runs this main process watches end, by task id.
_watched: dict[str, _Watched] = {}


def end_killed_run(
    app: Celery,
    task_name: str,
    task_id: str,
    header: dict[str, Any] | None,
    pid: object,
    *,
    status: str,
    reason: str,
) -> bool:
    """Celery is killing the process ``pid`` that runs a task, on purpose: stop the attempt its message
    names, and end it once that process is gone (``status``: its record's, unless an operator stopped it;
    ``reason``: why Celery killed it). False, with nothing changed, when no attempt is named (a delayed
    task that took its ticket on arrival: its lease runs out instead) or the named one no longer runs
    (it ended, or a recovery replaced it)."""
    if header is None:
        logger.info("keyed queue task %s was killed (%s); its message names no attempt to end", task_id, reason)
        return False
    key, ticket, dispatch = header["key"], int(header["ticket"]), int(header["dispatch"])
    stopping = worker_gate().stop(key, ticket, dispatch, by="", how=reason)
    if stopping is None:
        logger.info(
            "keyed queue task %s key=%r ticket=%s dispatch=%s was killed (%s) after it stopped holding its key",
            task_id, key, ticket, dispatch, reason,
        )  # fmt: skip
        current().totals.count("fenced", task_name)
        return False
    if not isinstance(pid, int) or isinstance(pid, bool):  # Celery's request may lack it
        logger.warning("keyed queue task %s was killed (%s) in no known process: its lease ends it", task_id, reason)
        return True
    started = _process_start(pid)
    if started is None:  # gone already (SIGKILL): ended here and now
        _end(app, task_id, key, ticket, dispatch, pid, status)
        return True
    _watched[task_id] = _Watched(key, ticket, dispatch, pid, started)
    watch = threading.Thread(
        target=_end_once_gone,
        args=(app, task_id, key, ticket, dispatch, pid, started, status),
        name="keyed-queue-killed-run",
        daemon=True,
    )
    watch.start()
    return True


def _end_once_gone(
    app: Celery, task_id: str, key: str, ticket: int, dispatch: int, pid: int, started: str, status: str
) -> None:
    # Past a few leases the process outlived its signal: its renewals, or their end, decide.
    give_up_at = time.monotonic() + 4 * float(settings.LEASE_SECONDS)
    try:
        while _process_start(pid) == started:
            if time.monotonic() > give_up_at:
                if _watched[task_id].runs():
                    logger.warning(
                        "keyed queue task %s key=%r: its process %s outlived the signal that was to end it; it "
                        "keeps its key while it renews its lease", task_id, key, pid,
                    )  # fmt: skip
                return
            time.sleep(WATCH_SECONDS)
        with forks.held_off():
            _end(app, task_id, key, ticket, dispatch, pid, status)
    finally:
        _watched.pop(task_id, None)
        with forks.held_off():
            connections.close_all()  # this thread's own


def kill_again(pool: Any, task_ids: list[str], signum: int) -> list[str]:
    """Revoked with ``terminate`` again: signal the processes of those of ``task_ids`` that were killed
    already and still run (Celery forgot them when it first killed them: a SIGKILL after an ignored
    SIGTERM would reach nobody). The task ids signalled."""
    signalled = []
    for task_id in task_ids:
        watched = _watched.get(task_id)
        if watched is not None and watched.runs():
            logger.info("Terminating %s again (%s), in process %s", task_id, signum, watched.pid)
            pool.terminate_job(watched.pid, signum)
            signalled.append(task_id)
    return signalled


def _end(app: Celery, task_id: str, key: str, ticket: int, dispatch: int, pid: int, status: str) -> None:
    """The killed run's process is gone: release its dispatch, record its end, publish what that grants."""
    try:
        for recovery in worker_gate().release(key, ticket, dispatch=dispatch):
            carry_out(app, recovery, reason=f"its process {pid} ended", stopped_status=status)
        current().recorder.flush()
        logger.info("keyed queue task %s key=%r ticket=%s ended with its process %s", task_id, key, ticket, pid)
    except Exception:
        logger.exception("keyed queue task %s key=%r: its killed run is ended at its lease's end instead", task_id, key)


def _process_start(pid: int) -> str | None:
    """What tells process ``pid`` apart from a later one given its number: its start time (Linux's
    /proc), or "alive" where there is no /proc; None once it is gone (or a zombie, its run over)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            # After the command's closing parenthesis: state is the first field, start time the 20th.
            fields = stat.read().rsplit(b")", 1)[1].split()
    except FileNotFoundError:
        return None
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return "alive"
    return None if fields[0] in (b"Z", b"X") else fields[19].decode()
