"""The worker's request of a keyed task, in the worker's main process.

Celery kills a run past its hard time limit from the worker's main process,
which knows the message it killed, and so the attempt: its ticket header. The
attempt is ended there once its process is gone (see ``killed``); any other attempt
of the same task, such as the one a recovery started after this one stalled,
goes on.

A job lost with its process after its own task ended, while it ran another by
local handoff, keeps that task's result (``on_failure``).

A delayed task (``countdown``, ``eta``) takes its ticket when due, here, before
the worker sends it to its pool: if it must wait for its key, its delivery ends
unrun, so no run signal fires for it until its turn.

A task of a key with a ``rate`` whose message came before the key's next start
is due goes out again for then (Celery's ``eta``), here too, so that waiting
holds no child process; the start itself checks the rate again, atomically.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, cast

from billiard.einfo import ExceptionWithTraceback  # type: ignore[attr-defined]  # Celery's own import; not in the stubs
from billiard.exceptions import Terminated, WorkerLostError
from celery.worker.request import Request
from celery.worker.state import task_ready

from ..gate import Grant
from ..messaging.message import HEADER, JOIN_HEADER, ticket_header
from ..process.state import worker_gate
from ..records.statuses import Status
from . import handoff_runs, killed
from .killed import end_killed_run
from .run_start import join, send_when_due

if TYPE_CHECKING:
    from billiard.einfo import ExceptionInfo
    from celery.app.task import Context

    from ..messaging.task_type import KeyedTaskProtocol


logger = logging.getLogger(__name__)


class KeyedRequest(Request):
    #: This delivery has asked the gate for a ticket (it is a delayed task now due).
    _joined = False

    @property
    def keyed_task(self) -> KeyedTaskProtocol:
        """Celery's ``task``: this request class is a keyed task's own (``KeyedSerialTask.Request``)."""
        return cast("KeyedTaskProtocol", self.task)

    def revoked(self) -> bool:
        """Celery's check before it sends a message to the pool; also where a delayed task now due joins
        its key's queue. True, as for a revoked message, when it must wait: acknowledged, and not run."""
        if super().revoked():
            return True
        header = self.request_dict.get(HEADER)
        if header is not None:
            return not self._joined and self._early_for_rate(header)
        if self._joined:
            return False
        if self.eta is not None and self.eta > datetime.now(UTC):
            return False  # asked on receipt: not due yet
        self._joined = True
        try:
            context: Context = self._context  # type: ignore[attr-defined]  # Request's own, not in celery-types
            key, submitted = join(
                self.keyed_task,
                context,
                self.args,
                self.kwargs,
                start=False,
                wait_out_outage=False,
                received=self.message,
            )
        except Exception:  # a bad key, or the gate unreachable: the run joins from the pool, as it can
            logger.warning("%s[%s] joins its key's queue from its run", self.name, self.id, exc_info=True)
            return False
        if submitted is not None and submitted.granted:
            self.request_dict[HEADER] = ticket_header(key, submitted.ticket, 1)[HEADER]
            self.request_dict.setdefault(JOIN_HEADER, self.id)  # names the join, as ``run.join`` took it
            self.__dict__.pop("_context", None)  # Celery's cached copy of the request, made without it
            return False
        logger.info("%s[%s] joined the queue of key=%r and waits for its turn", self.name, self.id, key)
        task_ready(self)
        self.acknowledge()
        return True

    def _early_for_rate(self, header: dict[str, Any]) -> bool:
        """A granted ticket that its key's rate does not let start yet: sent again for then, and True."""
        interval = getattr(self.task, "serial_interval_ms", 0)
        if not interval or (self.eta is not None and self.eta > datetime.now(UTC)):
            return False  # no rate; or Celery's timer holds it until its eta, and asks again then
        key, ticket, dispatch = header["key"], int(header["ticket"]), int(header["dispatch"])
        try:
            wait, message = worker_gate().wait_to_start(key, ticket, dispatch, interval_ms=interval)
            if not wait:
                return False
            send_when_due(self.keyed_task, Grant(key, ticket, dispatch, message or b""), wait)
        except Exception:  # the gate or the broker unreachable: the run's start decides, as it can
            logger.warning("%s[%s] is sent to its pool without its rate checked", self.name, self.id, exc_info=True)
            return False
        task_ready(self)
        self.acknowledge()
        return True

    def on_failure(self, exc_info: ExceptionInfo, send_failed_event: bool = True, return_ok: bool = False) -> None:
        """A job lost with its process after its own task ended, while it ran another by local handoff:
        the task's result stands (Celery before 5.7 would overwrite it with ``WorkerLostError``)."""
        exc = exc_info.exception
        exc = exc.exc if isinstance(exc, ExceptionWithTraceback) else exc
        if isinstance(exc, (WorkerLostError, Terminated, SystemExit, KeyboardInterrupt)):
            hosted = handoff_runs.hosted_by(self.id, self.worker_pid)
            if hosted is not None:
                logger.info("%s[%s] had ended when its process was lost running %s[%s] by local handoff",
                            self.name, self.id, hosted["task"], hosted["id"])  # fmt: skip
                task_ready(self)
                self.acknowledge()
                return None
        return super().on_failure(exc_info, send_failed_event=send_failed_event, return_ok=return_ok)

    def terminate(self, pool: Any, signal: Any = None) -> None:
        """Revoked with ``terminate``: Celery kills the process and tells ``task_revoked`` without it; note it.
        A task that has ended, whose job now runs its key's next task by local handoff, is left alone: the
        revoke names a task that ended, and changes nothing (as for a plain task that ended)."""
        hosted = handoff_runs.hosted_by(self.id, self.worker_pid) if self.worker_pid else None
        if hosted is not None:
            logger.info("%s[%s] has ended: not terminated (its process runs %s[%s] by local handoff)",
                        self.name, self.id, hosted["task"], hosted["id"])  # fmt: skip
            return
        if self.time_start and self.worker_pid:
            killed.terminating[self.id] = self.worker_pid
        super().terminate(pool, signal)

    def send_event(self, type: str, **fields: Any) -> None:
        """Celery's event of this request: not a ``task-succeeded`` or ``task-failed`` its child process sent
        already, when its task ended, before the runs its job hosted by local handoff."""
        eventer = self._eventer  # type: ignore[attr-defined]  # Request's own, not in celery-types
        if not (eventer and eventer.enabled and self.task.send_events):
            return  # as Celery's own send_event: no event, and no need to read the shared memory
        ends = ("task-succeeded", "task-failed")
        if type in ends and self.worker_pid and handoff_runs.announced(self.id, self.worker_pid):
            return
        super().send_event(type, **fields)

    def info(self, safe: bool = False) -> Any:  # celery-types' _InfoDict has no ``hosted_by``
        """Celery's ``inspect active`` entry: a job whose task ended and that runs another by local handoff
        is shown as that run (its id, task, arguments and start; ``hosted_by`` names the job's own task)."""
        info = dict(super().info(safe=safe))
        hosted = handoff_runs.hosted_by(self.id, self.worker_pid) if self.worker_pid else None
        return info if hosted is None else handoff_runs.shown(hosted, info)

    def on_timeout(self, soft: bool, timeout: float) -> None:
        super().on_timeout(soft, timeout)
        if soft:
            return  # the run sees SoftTimeLimitExceeded and ends itself, naming its lease
        try:
            end_killed_run(
                self.task.app,
                self.task.name,
                self.id,
                self._request_dict.get(HEADER),  # type: ignore[attr-defined]  # Request's own, not in celery-types
                self.worker_pid,
                status=Status.FAILED,
                reason=f"hard time limit exceeded ({timeout}s)",
            )
        except Exception:
            logger.exception("keyed task %s hit its hard time limit; its ticket is kept until the reaper acts", self.id)
