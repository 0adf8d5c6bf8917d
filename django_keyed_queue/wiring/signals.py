"""Wiring only: Celery's and Django's signals to the code that acts on them. Connected in ``AppConfig.ready``."""

from __future__ import annotations

import functools
import logging
import signal
from collections.abc import Callable
from typing import Any

from billiard.common import TERM_SIGNAME
from billiard.exceptions import WorkerLostError
from celery.platforms import signals as platform_signals
from celery.signals import (
    beat_init,
    task_failure,
    task_postrun,
    task_revoked,
    task_unknown,
    worker_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
)
from celery.utils.functional import maybe_list
from celery.worker import state as worker_state
from celery.worker.control import Panel
from django.core.signals import setting_changed
from django.dispatch import receiver

from ..conf import PREFIX, settings
from ..exceptions import ActionRefused
from ..keyed_task.task import KeyedSerialTask
from ..messaging import wire
from ..messaging.message import HEADER
from ..ops.actions.recovery import cancel, unknown_task, withdraw_revoked
from ..ops.actions.stop import STOP_ONLY
from ..process.state import WorkerTraits, current, note_worker
from ..records.statuses import Status
from ..records.submissions import RecordWriter
from ..worker import handoff, handoff_runs, killed
from ..worker.attempt_errors import note_lost_process
from ..worker.killed import end_killed_run
from ..worker.reconnect import republish_after_reconnect, tolerate_lost_brpop_on_close
from .reaper import WorkerReaper

logger = logging.getLogger(__name__)
#: Signals that end a child process: a run terminated with them never finishes by itself.
_ENDING_SIGNALS = (signal.SIGTERM, signal.SIGKILL)


@worker_init.connect
def _note_worker(sender: Any = None, **_: object) -> None:
    """Before the worker builds its consumer and forks its pool: what its processes need to know."""
    note_worker(WorkerTraits.of(sender))
    processes = max(sender.concurrency or 0, getattr(sender, "max_concurrency", None) or 0)
    handoff_runs.share(processes, task_events=bool(sender.task_events))
    _share_task_events()
    _count_handed_off_runs()
    tolerate_lost_brpop_on_close()
    _withdraw_revoked_tasks()
    reaper = sender.keyed_queue_reaper = WorkerReaper(sender.app, periodic=settings.WORKER_REAPER)
    sender.app.steps["consumer"].add(republish_after_reconnect(reaper.republish_unstarted))


def _wrap_control(name: str, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """Put ``wrap(command)`` in place of Celery's remote control command ``name``, once per process. Celery
    sends no signal when a worker receives a control command; its commands are a registry (``Panel``)."""
    command = Panel.data[name]
    if getattr(command, "keyed_queue_wrapped", False):
        return
    wrapped = functools.wraps(command)(wrap(command))
    wrapped.keyed_queue_wrapped = True  # type: ignore[attr-defined]
    Panel.data[name] = wrapped


def _withdraw_revoked_tasks() -> None:
    """Celery's ``revoke`` control command, then: the ids shared with the child processes
    (``handoff_runs.revoke``: a revoked task kept for a local handoff never starts), with ``terminate``,
    ``handoff_runs.terminate`` (Celery kills only tasks that came by message), and
    ``recovery.withdraw_revoked`` on its task ids."""

    def wrap(celery_revoke: Callable[..., Any]) -> Callable[..., Any]:
        def revoke(state: Any, task_id: Any, terminate: bool = False, signal: Any = None, **kwargs: Any) -> Any:
            stop_only = kwargs.pop(STOP_ONLY, False)
            reply = celery_revoke(state, task_id, terminate=terminate, signal=signal, **kwargs)
            task_ids = maybe_list(task_id) or []
            if stop_only:  # an operator's Stop ended the run; the task itself is not revoked
                for stopped in task_ids:
                    worker_state.revoked.discard(stopped)
            try:
                if not stop_only:
                    handoff_runs.revoke(task_ids)  # a kept grant of any of them never starts in a child process
                if terminate:
                    signum = platform_signals.signum(signal or TERM_SIGNAME)
                    handoff_runs.terminate(state.app, state.consumer, task_ids, signum)
                    killed.kill_again(state.consumer.pool, task_ids, signum)
                withdraw_revoked(task_ids, app=state.app)
            except Exception:
                logger.exception("revoked task ids %s: the keyed ones could not be withdrawn or killed", task_id)
            return reply

        return revoke

    _wrap_control("revoke", wrap)


def _count_handed_off_runs() -> None:
    """Celery's ``stats`` control command (``inspect stats``), its ``total`` counting the runs the worker's
    child processes ran by local handoff too (``handoff_runs.handed_off_totals``), as it counts a message's."""

    def wrap(command: Callable[..., Any]) -> Callable[..., Any]:
        def stats(state: Any, **kwargs: Any) -> Any:
            reply = command(state, **kwargs)
            if isinstance(reply, dict) and isinstance(reply.get("total"), dict):
                total = dict(reply["total"])
                for name, n in handoff_runs.handed_off_totals().items():
                    total[name] = total.get(name, 0) + n
                reply["total"] = total
            return reply

        return stats

    _wrap_control("stats", wrap)


def _share_task_events() -> None:
    """Celery's ``enable_events`` and ``disable_events`` control commands, then whether the worker sends
    task events now, shared with its child processes (``handoff_runs.set_task_events``): a run by local
    handoff sends its events as the worker's main process sends a message's."""

    def wrap(command: Callable[..., Any]) -> Callable[..., Any]:
        def shared(state: Any, *args: Any, **kwargs: Any) -> Any:
            reply = command(state, *args, **kwargs)
            dispatcher = state.consumer.event_dispatcher
            if dispatcher is not None:
                groups = dispatcher.groups
                handoff_runs.set_task_events(bool(dispatcher.enabled and (not groups or "task" in groups)))
            return reply

        return shared

    for name in ("enable_events", "disable_events"):
        _wrap_control(name, wrap)


@task_postrun.connect
def _run_kept_grant(
    sender: Any = None, task_id: str = "", retval: Any = None, state: str | None = None, **_: object
) -> None:
    """The finished task's result is stored: run the next task of its key here (local handoff)."""
    handoff.local().run_kept(sender.app, task_id, retval, state)


@task_revoked.connect
def _end_revoked(
    sender: Any = None,
    request: Any = None,
    terminated: bool = False,
    signum: Any = None,
    expired: bool = False,
    **_: object,
) -> None:
    """Celery dropped a keyed task's message (expired, revoked), or killed its run: its key passes on."""
    if request is None or not isinstance(sender, KeyedSerialTask):
        return
    try:
        if terminated:
            if signum not in _ENDING_SIGNALS:
                return  # e.g. SIGUSR1: the task sees an exception and ends its run itself
            end_killed_run(
                sender.app,
                sender.name,
                request.id,
                getattr(request, HEADER, None),
                # Celery's request context lacks it: its request noted it (a run by local handoff carries it).
                killed.terminating.pop(request.id, None) or getattr(request, "worker_pid", None),
                status=Status.CANCELLED,
                reason=f"revoked by Celery, its process terminated ({signal.Signals(signum).name})",
            )
            return
        cancel(request.id, by="Celery: it expired" if expired else "Celery: it was revoked", app=sender.app)
    except ActionRefused as exc:
        logger.info("keyed task %s was dropped by Celery: %s", request.id, exc)
    except Exception:
        logger.exception("keyed task %s was dropped by Celery; its ticket is kept until the reaper acts", request.id)


@task_failure.connect
def _note_lost_process(
    sender: Any = None, task_id: str = "", exception: BaseException | None = None, **_: object
) -> None:
    """Celery's worker reports a keyed task's child process lost: its record says so at once. The run keeps
    its key until its lease ends (a process of its own may outlive it), then the reaper dispatches it again."""
    if not isinstance(sender, KeyedSerialTask) or not isinstance(exception, WorkerLostError):
        return
    try:
        note_lost_process(task_id, getattr(sender.request, HEADER, None) if sender.request.id == task_id else None,
                          exception)  # fmt: skip
    except Exception:
        logger.exception("keyed task %s: its lost process could not be noted on its record", task_id)


@task_unknown.connect
def _unknown_keyed_task(sender: Any = None, message: Any = None, name: str = "", id: str = "", **_: object) -> None:  # noqa: A002
    """Celery dropped a message of a task this worker does not know: if keyed, its key must not wait for it."""
    header = (getattr(message, "headers", None) or {}).get(HEADER)
    if header is None:
        return
    try:
        unknown_task(sender.app, name, id, header)
    except Exception:
        logger.exception("keyed task %s[%s] is unknown here; the reaper publishes it again", name, id)


@worker_process_shutdown.connect
def _close_process(**_: object) -> None:
    current().close()


@receiver(setting_changed)
def _settings_changed(setting: str, **_: object) -> None:
    if setting.startswith(PREFIX):
        current().reset_gate()


@worker_ready.connect
def _start_worker_reaper(sender: Any = None, **_: object) -> None:
    """Every worker reaps, so recovery needs no beat process; reapers racing are safe."""
    reaper = getattr(sender.controller, "keyed_queue_reaper", None)
    with sender.app.connection_for_write() as connection:
        logger.info("keyed queue: %s", wire.describe(current().gate.client, connection))
    if reaper is not None:
        reaper.start()
        # Submissions' rows are written by the workers (see ``records.submissions``).
        sender.controller.keyed_queue_record_writer = RecordWriter(lambda: current().gate).start()


@worker_shutdown.connect
def _stop_worker_reaper(sender: Any = None, **_: object) -> None:
    for upkeep in ("keyed_queue_reaper", "keyed_queue_record_writer"):
        thread = getattr(sender, upkeep, None)
        if thread is not None:
            thread.stop()


@beat_init.connect
def _schedule_upkeep(sender: Any = None, **_: object) -> None:
    """Give ``celery beat`` the reaper and purge entries unless the project scheduled them itself."""
    from .tasks import PURGE_ENTRY, PURGE_INTERVAL_SECONDS, REAP_ENTRY

    entries = {
        REAP_ENTRY: {"task": "keyed_queue.reap", "schedule": settings.REAP_INTERVAL_SECONDS},
        PURGE_ENTRY: {"task": "keyed_queue.purge", "schedule": PURGE_INTERVAL_SECONDS},
    }
    configured = sender.app.conf.beat_schedule or {}
    sender.scheduler.update_from_dict({name: entry for name, entry in entries.items() if name not in configured})
