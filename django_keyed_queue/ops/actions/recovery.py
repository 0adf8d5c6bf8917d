"""Recovery: the one home of acting on lost runs, lost messages and stuck keys.

The reaper (a thread in every worker, and the beat task), the management
commands and the admin's actions call these functions. Redis decides through
the gate's scripts; this module publishes what they hand back and records it.
Each operator's action either does all it says or raises ActionRefused,
having changed nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from celery import Celery, signals, states
from celery.app.task import Context
from celery.backends.base import DisabledBackend
from celery.utils import uuid
from django.db import close_old_connections, models, transaction
from django.utils import timezone

from ...exceptions import ActionRefused
from ...gate import Cancel, Code, Holder, Recovery, RecoveryAction
from ...keyed_task.task import KeyedSerialTask
from ...messaging.dispatch import REPUBLISH_DELAY_SECONDS, Dispatched, fail_ticket, publish_grants
from ...messaging.recovered import carry_out, recorded
from ...process.state import current, operator_gate
from ...producer.submit import submit
from ...records import submissions
from ...records.idempotency import repoint
from ...records.models import KeyedTask
from ...records.statuses import Status
from ..display import did, last_line
from . import AUDIT_LOGGER
from .lookup import celery_app, join_id_of, latest_row, operator_key, registered_task, slot_of, stored_message

logger = logging.getLogger(AUDIT_LOGGER)


@dataclass
class ReapReport:
    visited: int = 0
    recoveries: list[Recovery] = field(default_factory=list)
    #: Recoveries whose message the broker refused: the reaper publishes them again.
    unpublished: list[Recovery] = field(default_factory=list)
    #: Submissions whose rows were written from the records kept in the gate.
    written: int = 0

    def count(self, action: RecoveryAction) -> int:
        return sum(1 for r in self.recoveries if r.action is action)

    def summary(self) -> str:
        counts = ", ".join(f"{a} {self.count(a)}" for a in RecoveryAction)
        failed = f"; {len(self.unpublished)} could not be published" if self.unpublished else ""
        return f"visited {self.visited} due keys: {counts}{failed}"


def reap(*, dry_run: bool = False, batch: int = 500, max_batches: int = 100, app: Celery | None = None) -> ReapReport:
    """Write the rows of submissions kept in the gate, and recover every holder whose deadline passed;
    in a dry run, only report what would be recovered."""
    app = celery_app(app)
    report = ReapReport()
    if not dry_run:
        # A key's recovery never waits on the records' database.
        written = recorded("writing submissions' rows", submissions.write_due, operator_gate(), young=False)
        report.written = written or 0
    for _ in range(max_batches):
        visited, found = operator_gate().reap(batch=batch, dry_run=dry_run)
        report.visited += visited
        report.recoveries += found
        if not dry_run:
            report.unpublished += [recovery for recovery in found if not carry_out(app, recovery)]
        if dry_run or visited < batch:
            break
    if report.recoveries:
        logger.info("keyed queue reaper %s%s", "(dry run) " if dry_run else "", report.summary())
    return report


def republish_unstarted(lost_seconds: float, *, app: Celery | None = None) -> ReapReport:
    """Publish again what was granted before a broker connection was lost ``lost_seconds`` ago and not started.

    A worker calls it when its consumer reconnects (see ``reconnect``): what
    it had received and not started is stranded until kombu's visibility
    timeout, and a message in flight when Redis died is gone.
    """
    app = celery_app(app)
    found = operator_gate().republish_unstarted(granted_seconds_ago=lost_seconds)
    report = ReapReport(visited=len({r.key for r in found}), recoveries=found)
    report.unpublished = [recovery for recovery in found if not carry_out(app, recovery)]
    logger.info(
        "keyed queue: %d grants made before the broker connection was lost published again "
        "(%d refused by the broker); other recoveries: %s",
        report.count(RecoveryAction.REPUBLISH),
        len(report.unpublished),
        report.summary(),
    )
    return report


def pause(key: str, *, by: str = "an operator") -> bool:
    """Pause a key: nothing new is dispatched; submissions still queue in order. False if it was paused
    already: it keeps its pause (when, by whom), and that is no error (repeated, a pause does the same)."""
    if not operator_gate().pause(operator_key(key), by=by):
        logger.info("keyed queue key %r: paused already; %s changed nothing", key, by)
        return False
    logger.info("keyed queue key %r paused by %s", key, by)
    return True


def resume(key: str, *, by: str = "an operator", app: Celery | None = None) -> Dispatched | None:
    """Resume a key and dispatch what it had waiting, up to its limit; None if it was not paused, which is
    no error (repeated, a resume does the same), and nothing is written for it.

    A grant the broker refused is published again by the reaper.
    """
    gate = operator_gate()
    # Read first, so that a key never paused writes nothing; the resume itself says whether it resumed
    # the key, so that of racing resumes one does and the others are told it was not paused.
    granted = gate.resume(key) if gate.is_paused(operator_key(key)) else None
    if granted is None:
        logger.info("keyed queue key %r: not paused; %s changed nothing", key, by)
        return None
    done = publish_grants(celery_app(app), granted)
    current().recorder.flush()
    logger.info("keyed queue key %r resumed by %s: %s", key, by, done)
    return done


# -- what each action refuses: its one home, which every surface calls (the page, the list, the live page,
# -- the commands, the API) and the action itself checks again ----------------------------------------


#: Why a running task is not cancelled, whether its slot says it runs or the gate's cancel finds it started.
RUNNING_NOT_CANCELLED = "task {task} is running: stop it instead"


def blocks_its_key(row: KeyedTask, holder: Holder | None) -> bool:
    """Whether ``row``'s task failed and its slot (``holder``) keeps its key held (``on_failure="block"``)."""
    return row.status == Status.FAILED and holder is not None and holder.state == "blocked"


def retry_refusal(row: KeyedTask) -> str:
    """Why ``row``'s task cannot be retried now; '' when it can."""
    if row.retried_as:
        return f"task {row.task_id} was retried already: it runs again as task {row.retried_as}"
    if row.status != Status.FAILED:
        return f"task {row.task_id} {did(row.status)}: only a failed task can be retried"
    return ""


def cancel_refusal(row: KeyedTask, holder: Holder | None) -> str:
    """Why ``row``'s task cannot be cancelled now (``holder``: its slot, ``slot_of``); '' when it can."""
    if blocks_its_key(row, holder):
        return ""
    if holder is not None and holder.state == "running":
        return RUNNING_NOT_CANCELLED.format(task=row.task_id)
    if row.status not in (Status.WAITING, Status.DISPATCHED):
        return (
            f"task {row.task_id} {did(row.status)}: only a waiting or dispatched task, or a failed one that blocks "
            "its key, can be cancelled"
        )
    return ""


def release_refusal(key: str, ticket: int | None, holder: Holder | None, task_id: str | None = None) -> str:
    """Why ``ticket`` of ``key`` cannot be released now (``holder``: its slot, of task ``task_id`` if named);
    '' when it can."""
    if ticket is None:
        return f"task {task_id} has no ticket: it holds no key"
    if holder is not None and holder.state == "blocked":
        return f"ticket {ticket} of key {key!r} failed and blocks its key: retry or cancel its task"
    if holder is None or holder.state not in ("running", "granted"):
        whose = f" for task {task_id}" if task_id is not None else ""
        return f"ticket {ticket} of key {key!r} holds no slot{whose}: it finished or was recovered"
    return ""


# -- the operator's actions ---------------------------------------------------


def cancel(task_id: str, *, by: str = "an operator", app: Celery | None = None) -> KeyedTask:
    """Cancel a task that has not started: it leaves its key's queue and never runs. A failed task
    that blocks its key (``on_failure="block"``) is cancelled too: its key's next task runs.
    Returns its row as it was."""
    row = latest_row(task_id)
    # Only a failed task's slot is read (does it block its key?): the gate's cancel itself refuses, in its
    # one atomic call, any other task that started.
    holder = slot_of(row) if row.status == Status.FAILED else None
    if refusal := cancel_refusal(row, holder):
        raise ActionRefused(refusal)
    if blocks_its_key(row, holder):
        _unblock(row, retry=False, app=app)
        error = f"cancelled by {by} after it failed, blocking its key\n\n{row.error}"
        KeyedTask.objects.filter(pk=row.pk, status=Status.FAILED).update(status=Status.CANCELLED, error=error)
        logger.info("keyed queue task %s key=%r, which blocked its key, cancelled by %s", task_id, row.key, by)
        return row
    gate = operator_gate()
    if row.ticket is None:
        # Sent with a countdown or eta: it takes its ticket when due, unless refused now.
        due_in = (row.due_at - timezone.now()).total_seconds() if row.due_at else 0.0
        if not gate.refuse_join(row.key, join_id_of(row, celery_app(app)), due_in_seconds=due_in):
            raise ActionRefused(f"task {task_id} joined its key's queue just now; look again and retry")
    else:
        withdrawn = gate.cancel(Cancel(row.key, row.ticket))  # the key's own limit, as its submissions set it
        if withdrawn.code is Code.RUNNING:
            raise ActionRefused(RUNNING_NOT_CANCELLED.format(task=task_id))
        if withdrawn.code is not Code.OK:
            raise ActionRefused(f"the gate holds no ticket {row.ticket} of key {row.key!r}: it ended meanwhile")
        publish_grants(celery_app(app), withdrawn.granted)
        current().recorder.flush()  # the operator sees the next task dispatched on their next look
    KeyedTask.objects.settle_rows([row.pk], Status.CANCELLED, finished_at=timezone.now(), error=f"cancelled by {by}")
    current().totals.count("finished", row.task_name, outcome=Status.CANCELLED)
    logger.info("keyed queue task %s key=%r cancelled by %s", task_id, row.key, by)
    return row


def withdraw_revoked(task_ids: Iterable[str], *, app: Celery | None = None) -> list[str]:
    """Celery revoked ``task_ids`` (this worker got ``revoke``): withdraw the keyed ones that wait for their key.

    Celery's workers drop a revoked task when its message arrives, but a task that
    waited for its key may run without one, by local handoff in a child process that
    never sees the revoked ids. So the first worker to get the revoke withdraws the
    ticket here, and does what a worker does for a revoked message: the result says
    ``REVOKED`` and ``task_revoked`` is sent. The task ids withdrawn.
    """
    app = celery_app(app)
    close_old_connections()  # this runs in the worker's main process, between messages
    submissions.write_due(operator_gate())  # a task submitted just now is revoked too
    unstarted = KeyedTask.objects.filter(task_id__in=set(task_ids), status__in=(Status.WAITING, Status.DISPATCHED))
    withdrawn = []
    for task_id, task_name in unstarted.values_list("task_id", "task_name").distinct():
        try:  # each on its own: one that cannot be withdrawn is logged, and the others still are
            if _withdraw_revoked(app, task_id, task_name):
                withdrawn.append(task_id)
        except Exception:
            logger.exception("revoked keyed task %s could not be withdrawn; the others are", task_id)
    return withdrawn


def _withdraw_revoked(app: Celery, task_id: str, task_name: str) -> bool:
    """Withdraw one revoked task that waits for its key, as a worker drops a revoked message; False if it
    cannot be (another worker withdrew it, or it started meanwhile)."""
    try:
        cancel(task_id, by="Celery: it was revoked", app=app)
    except ActionRefused as refused:
        logger.info("revoked keyed task %s is not withdrawn: %s", task_id, refused)
        return False
    task = app.tasks.get(task_name)
    backend = task.backend if task is not None else app.backend
    # Celery 5.7 marks it itself, earlier ones do not; a project with no result backend (Celery's
    # default) keeps no state to read or mark.
    if not isinstance(backend, DisabledBackend) and backend.get_state(task_id) == states.PENDING:
        backend.mark_as_revoked(task_id, reason="revoked")
    request = Context({"id": task_id, "task": task_name})
    signals.task_revoked.send(sender=task, request=request, terminated=False, signum=None, expired=False)
    return True


def retry(task_id: str, *, by: str = "an operator", app: Celery | None = None) -> str:
    """Run a failed task again; the id of the task that runs.

    A task that blocks its key (``on_failure="block"``) runs again first, as itself (its id is
    returned); any other is submitted again, with its arguments, at the end of its key's queue,
    as a new task. Once: the failed row is marked retried, naming the new task, in the transaction
    that submits it, so a second retry of it, repeated or racing, is refused naming the first's.
    """
    app = celery_app(app)
    row = latest_row(task_id)
    if blocks_its_key(row, slot_of(row)):
        # Marked first: the run may start, and write its own progress, as soon as it is published.
        retried_at = timezone.now()
        again = {"dispatched_at": retried_at, "finished_at": None, "error": f"retried first by {by}"}
        marked = KeyedTask.objects.filter(pk=row.pk, status=Status.FAILED).update(
            status=Status.DISPATCHED, attempts=models.F("attempts") + 1, **again
        )
        if not marked:
            raise ActionRefused(f"task {task_id} is no longer failed: it was retried or cancelled meanwhile")
        # Its error gives way to the retry's: the failed attempt stays in its notes.
        ran = (row.worker, row.started_at) if row.started_at else None
        ended = row.finished_at or retried_at
        failed = f"failed ({last_line(row.error) or 'no error kept'}); retried first by {by}"
        KeyedTask.objects.note_attempt(task_id, row.key, row.ticket or 0, row.attempts, failed, ended, ran)
        _unblock(row, retry=True, app=app)
        logger.info("keyed queue task %s key=%r, which blocked its key, retried first by %s", task_id, row.key, by)
        return task_id
    if refusal := retry_refusal(row):
        raise ActionRefused(refusal)
    message = stored_message(row, app)
    task = registered_task(app, message.task_name)
    new_id = uuid()
    with transaction.atomic(using=KeyedTask.objects.db_for_write()):
        # The row's lock: a racing retry waits here, then finds it marked.
        if not KeyedTask.objects.filter(pk=row.pk, status=Status.FAILED, retried_as="").update(retried_as=new_id):
            now = KeyedTask.objects.get(pk=row.pk)
            raise ActionRefused(retry_refusal(now) or f"task {task_id} moved on meanwhile: look again")
        # Idempotency keys that gave the failed task now give its retry (in this transaction if they share it).
        repoint(task_id, new_id)
        try:
            # Not at a commit (KEYED_QUEUE_SUBMIT_ON_COMMIT): submitted in the transaction that marks it.
            submit(task, message.args, message.kwargs, {**message.options, "task_id": new_id}, None)
        except BaseException:
            repoint(new_id, task_id)  # in case they live in another database
            raise
    submissions.write_key(operator_gate(), row.key)  # the operator sees the retry at once
    KeyedTask.objects.filter(task_id=new_id, key=row.key).update(retry_of=task_id)  # its page links the failure
    logger.info("keyed queue task %s key=%r retried as %s by %s", task_id, row.key, new_id, by)
    return new_id


def unknown_task(app, name: str, task_id: str, header: Any) -> None:
    """A worker got a keyed task's message and knows no task ``name``: Celery dropped the message.

    The message goes out again soon, for a worker that may know the task (a deploy under
    way); once it was dropped ``max_recoveries`` times more (of ``KeyedSerialTask``: the task's
    own is unknown here), the task fails, naming the cause, and its key moves on. ``header`` is the
    message's ticket header, as anyone may have written it: only that dispatch of that task's
    ticket is acted on.
    """
    if not (
        isinstance(header, dict)
        and isinstance(header.get("key"), str)
        and all(isinstance(header.get(f), int) and not isinstance(header.get(f), bool) for f in ("ticket", "dispatch"))
    ):
        return
    key, ticket, dispatch = header["key"], header["ticket"], header["dispatch"]
    drops = operator_gate().undelivered(key, ticket, dispatch, delay_seconds=REPUBLISH_DELAY_SECONDS)
    if drops is None:
        return  # not that dispatch of a granted ticket: another copy started, or it ended
    if drops <= KeyedSerialTask.max_recoveries:
        logger.warning("no worker here knows task %s[%s] key=%r: it is published again", name, task_id, key)
        return
    error = f"no worker knows task {name}: its message went out {drops} times and was dropped each time"
    granted = fail_ticket(key, ticket, task_id, error, dispatch=dispatch)
    logger.error("keyed queue task %s key=%r ticket=%s: %s", task_id, key, ticket, error)
    publish_grants(app, granted)


#: A release that names no dispatch (a command) refuses a holder dispatched less than this long ago:
#: the same release repeated, or a worker about to start it.
RELEASE_GRACE_SECONDS = 10.0


#: Why a release of many tasks at once leaves a running one alone: it would run again beside itself.
RUNNING_NOT_RELEASED_WITH_OTHERS = (
    "task {task} is running: released, it would be dispatched again while its run goes on, two runs of one "
    "task at once. Stop it, or release it from its own page, which says what that does"
)


def release(
    key: str,
    ticket: int,
    *,
    dispatch: int | None = None,
    task_id: str | None = None,
    by: str = "an operator",
    unstarted: bool = False,
    app: Celery | None = None,
) -> list[Recovery]:
    """Release a key's stuck holder now, as the reaper does when a lease expires.

    Its run is fenced (its lease is gone: ``holds_key()`` is False, its
    renewals fail) and its task is dispatched again, or failed once it used
    its recoveries; a holder whose message was lost has it published again.
    ``dispatch``: the holder's dispatch as the operator saw it (None: as it is now); a
    release of a dispatch released already, by a second click or another terminal, is refused.
    ``task_id``: the task the operator saw hold the ticket (None: whichever does); a ticket held by
    another task (the key drained and its tickets started over) is refused. ``unstarted``: only a holder
    granted and not started is released (the task list's release of many); one running is refused.
    """
    app = celery_app(app)
    gate = operator_gate()
    holder = gate.inspect(operator_key(key), waiting_shown=0).held_by(ticket, task_id)
    if refusal := release_refusal(key, ticket, holder, task_id):
        raise ActionRefused(refusal)
    assert holder is not None  # it holds a slot
    since = gate.dispatch_timeout_ms / 1000 - holder.deadline_in  # since it was (re)dispatched, when granted
    if dispatch is None and holder.state == "granted" and since < RELEASE_GRACE_SECONDS:
        raise ActionRefused(
            f"ticket {ticket} of key {key!r} was dispatched {max(since, 0):.1f}s ago and a worker may be starting "
            f"it: released already? Release it if it has not started in {RELEASE_GRACE_SECONDS:.0f}s"
        )
    running = RUNNING_NOT_RELEASED_WITH_OTHERS.format(task=holder.task_id or f"of ticket {ticket}")
    if unstarted and holder.state == "running":
        raise ActionRefused(running)
    seen = holder.dispatch if dispatch is None else dispatch
    recoveries = gate.release(key, ticket, dispatch=seen, unstarted=unstarted)
    released = any(r.ticket == ticket for r in recoveries)
    if not released and unstarted:
        now = gate.inspect(key, waiting_shown=0).held_by(ticket, task_id)
        if now is not None and now.state == "running":  # it started since it was read: left running
            raise ActionRefused(running)
    if not released:
        raise ActionRefused(
            f"ticket {ticket} of key {key!r} moved on from dispatch {seen}: it was released, recovered or "
            "finished meanwhile; look again"
        )
    # A running attempt released may still run: its note says so (the attempt after it may run beside it).
    beside = "; it may still run: its end is refused, and the attempt after it may run beside it until it ends"
    for recovery in recoveries:
        carry_out(app, recovery, reason=f"released by {by}", after=beside if holder.state == "running" else "")
    current().recorder.flush()
    logger.info("keyed queue key=%r ticket=%s released by %s", key, ticket, by)
    return recoveries


def _unblock(row: KeyedTask, *, retry: bool, app) -> None:
    """Run the blocking ticket of ``row`` again, or withdraw it; publish what that grants."""
    done = operator_gate().unblock(row.key, row.ticket, retry=retry)  # type: ignore[arg-type]  # checked by the caller
    if done.code is not Code.OK:
        raise ActionRefused(f"task {row.task_id} no longer blocks key {row.key!r}: look again")
    publish_grants(celery_app(app), done.granted)
    current().recorder.flush()  # the operator sees the next task dispatched on their next look
