"""An operator's action on one task, from its page or its key's live row: first what it will do, then done.

Each action is proposed from what the gate and the records say now (``propose``), shown for the
operator to confirm, and then done through the recovery module (``perform``), which refuses it if
the task moved on meanwhile. A release names the dispatch the operator was shown, so a second
click, or a click racing the reaper, frees nothing twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from celery import current_app

from ..exceptions import ActionRefused
from ..gate import Holder
from ..process.state import get_gate
from ..records.models import KeyedTask
from ..records.statuses import Status
from . import lookup, recovery, run_now, stop
from .display import did, since

ACTIONS = ("retry", "run_now", "cancel", "stop", "release")

#: What an operator is told an action does, as a button says it.
VERBS = {"retry": "Retry", "run_now": "Run now", "cancel": "Cancel", "stop": "Stop", "release": "Release"}


@dataclass
class Proposal:
    """An action on ``task`` as it would be done now: ``refusal`` says why it would not be."""

    action: str
    task: KeyedTask
    what: list[str] = field(default_factory=list)  # what it will do, as sentences
    refusal: str = ""
    #: What the confirmation posts back: the release's ticket and dispatch, as the operator saw them.
    seen: dict[str, int] = field(default_factory=dict)
    #: What the operator picks as they confirm: a name, and its choices (the first is the default).
    choices: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: Another action the operator may want instead (a running task's Release offers Stop).
    instead: str = ""

    @property
    def applies(self) -> bool:
        return not self.refusal


def available(task: KeyedTask, holder: Holder | None) -> list[str]:
    """The actions that apply to ``task`` in its state (``holder``: its ticket's slot in the gate, if any)."""
    found = []
    if task.status == Status.FAILED and not task.retried_as:
        found.append("retry")
    granted = holder is not None and holder.state == "granted"
    if (
        (task.ticket is None or granted)
        and task.status in (Status.WAITING, Status.DISPATCHED)
        and run_now.waits_for(task)
    ):
        found.append("run_now")
    if task.status in (Status.WAITING, Status.DISPATCHED) and (holder is None or holder.state == "granted"):
        found.append("cancel")
    elif task.status == Status.FAILED and holder is not None and holder.state == "blocked":
        found.append("cancel")
    if holder is not None and holder.state == "running":
        found.append("stop")
    if holder is not None and holder.state in ("running", "granted"):
        found.append("release")
    return found


def holder_of(task: KeyedTask) -> Holder | None:
    """The slot ``task``'s ticket holds in the gate, if any (one round trip)."""
    if task.ticket is None:
        return None
    return get_gate().inspect(task.key, waiting_shown=0).held_by(task.ticket, task.task_id)


def propose(action: str, task: KeyedTask) -> Proposal:
    holder = holder_of(task)
    proposal = Proposal(action, task)
    if action not in available(task, holder):
        proposal.refusal = _not_now(action, task, holder)
        return proposal
    name, key = f"{task.task_name}[{task.task_id}]", task.key
    if action == "retry":
        if holder is not None and holder.state == "blocked":
            proposal.what = [
                f"{name} failed and blocks key {key!r}. It runs again first, as itself (the same task id), "
                "before the tasks waiting behind it."
            ]
        else:
            try:
                lookup.stored_message(task, current_app)
            except ActionRefused as refused:
                proposal.refusal = f"{refused}. Submit the task again from your code."
                return proposal
            proposal.what = [
                f"{name} is submitted again as a new task, with the same arguments, at the end of the queue of key "
                f"{key!r}.",
                "This record stays as it is and says which task it was retried as.",
            ]
    elif action == "cancel":
        if holder is not None and holder.state == "blocked":
            proposal.what = [f"{name} failed and blocks key {key!r}: it is cancelled, and the key's next task runs."]
        else:
            proposal.what = [
                f"{name} leaves the queue of key {key!r} and never runs; its record says you cancelled it.",
                "If a worker starts it first, the cancel is refused: release it then.",
            ]
    elif action == "run_now":
        waits = run_now.waits_for(task)
        if task.ticket is None:
            proposal.what = [
                f"{name} joins the queue of key {key!r} now, instead of when its countdown or eta is due; it then "
                "waits its turn behind the key's earlier tasks. The message that waits for its eta is dropped when "
                "it comes."
            ]
        else:
            proposal.what = [
                f"{name} starts now instead of waiting for {waits}: its message is published again without an "
                "eta, and a worker starts it at once; the copy that waits is dropped when it comes, so it runs once."
            ]
    elif action == "stop":
        assert holder is not None
        refusal = stop.cannot_end(current_app, task.worker if task.attempts == holder.attempts else "")
        if refusal:
            proposal.refusal = refusal
            return proposal
        proposal.seen = {"ticket": task.ticket or 0, "dispatch": holder.dispatch}
        proposal.choices = {"signal": stop.SIGNALS}
        ran = f" for {since(task.started_at)}" if task.started_at else ""
        where = f" on worker {task.worker}" if task.worker else ""
        proposal.what = [
            f"The run of {name}{ran}{where} (ticket {task.ticket}, attempt {holder.attempts}) is ended: Celery's "
            "worker kills its process with the signal you pick (SIGTERM lets it run its exit handlers; SIGKILL "
            "cannot be ignored).",
            f"Key {key!r} keeps it until the run has ended (its worker sees the process gone, or its lease ends): "
            "the next task starts after it, never beside it. The task fails, stopped by you"
            f"{', and blocks its key' if holder.blocks_on_failure else ''}; it is not dispatched again.",
        ]
    else:
        assert holder is not None
        proposal.seen = {"ticket": task.ticket or 0, "dispatch": holder.dispatch}
        if holder.state == "granted":
            proposal.what = [
                f"{name} was dispatched (ticket {task.ticket}, dispatch {holder.dispatch}) and has not started: its "
                "message is published again; a copy of the old one that reaches a worker later is dropped."
            ]
        else:
            ran = f" for {since(task.started_at)}" if task.started_at else ""
            proposal.what = [
                f"Key {key!r} is freed from {name}'s run{ran} (ticket {task.ticket}, attempt {holder.attempts}, "
                f"fencing token {holder.token}): the task is dispatched again, as when a lease expires"
                f"{'' if holder.lost < holder.max_lost else ', or fails, having used its recoveries'}.",
                "The released run is not stopped. If it is still executing, it goes on beside the new attempt "
                "until it ends on its own; its lease renewals and its end are refused. Code that checks "
                f"self.holds_key(), or stores self.keyed_lease.token ({holder.token}) with its writes and "
                "refuses older tokens, stays safe.",
            ]
            if "stop" in available(task, holder):
                proposal.instead = "stop"
    return proposal


def perform(
    action: str, task: KeyedTask, by: str, seen: dict[str, int] | None = None, picked: dict[str, str] | None = None
) -> tuple[str, str | None]:
    """Do ``action`` on ``task``: what was done, and the id of the task that now runs (a retry's, which the
    text then ends by naming), if any.
    ActionRefused if it no longer applies. ``seen``: the ticket and dispatch a release or stop names, as the
    operator confirmed them (None: as they are now, for the task list's action on many tasks); ``picked``:
    what the operator chose among the proposal's ``choices``."""
    if action == "retry":
        new_id = recovery.retry(task.task_id, by=by)
        if new_id == task.task_id:
            return f"Retried by {by} first on its key: it runs again before the key's others", new_id
        return f"Retried by {by} as", new_id  # the caller names (and links) the new task
    if action == "run_now":
        return f"Run now by {by}: {run_now.run_now(task.task_id, by=by)}", None
    if action == "cancel":
        was = recovery.cancel(task.task_id, by=by)
        after = " after it failed, blocking its key: the key moves on" if was.status == Status.FAILED else ""
        return f"Cancelled by {by}{after}", None
    if task.ticket is None:
        raise ActionRefused(f"task {task.task_id} has no ticket: it holds no key")
    if seen is not None and (seen.get("ticket") != task.ticket or "dispatch" not in seen):
        raise ActionRefused(f"the {action} names no ticket and dispatch of this task: look again")
    dispatch = None if seen is None else seen["dispatch"]
    if action == "stop":
        signal = (picked or {}).get("signal", stop.SIGNALS[0])
        return stop.stop(task.task_id, by=by, signal=signal, dispatch=dispatch).said(), None
    released = recovery.release(task.key, task.ticket, dispatch=dispatch, task_id=task.task_id, by=by)
    return f"Released by {by} ({', '.join(r.action for r in released if r.ticket == task.ticket)})", None


def _not_now(action: str, task: KeyedTask, holder: Holder | None) -> str:
    if action == "retry":
        if task.retried_as:
            return f"it was retried already, as task {task.retried_as}"
        return f"it {did(task.status)}: only a failed task can be retried"
    if action == "cancel":
        if holder is not None and holder.state == "running":
            return "it is running: stop it instead"
        only = "only a waiting or dispatched task, or a failed one that blocks its key, is cancelled"
        return f"it {did(task.status)}: {only}"
    if action == "stop":
        return "it is not running: only a running task is stopped"
    if action == "run_now":
        return "it waits for no time (a debounce, an eta or its key's rate): only such a task runs now"
    return "it holds no slot of its key now: it is not running or dispatched"
