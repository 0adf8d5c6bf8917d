"""An operator's action on one task, from its page or its key's live row: first what it will do, then done.

Each action is proposed from what the gate and the records say now (``propose``), shown for the
operator to confirm, and then done through the recovery module (``perform``), which refuses it if
the task moved on meanwhile. A release names the dispatch the operator was shown, so a second
click, or a click racing the reaper, frees nothing twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from celery import current_app

from ...exceptions import ActionRefused
from ...gate import Holder
from ...process.state import operator_gate
from ...records.models import KeyedTask
from ...records.statuses import Status
from ..display import since
from . import lookup, recovery, run_now, stop
from .lookup import slot_of

ACTIONS = ("retry", "run_now", "cancel", "stop", "release")

#: What an operator is told an action does, as a button says it.
VERBS = {"retry": "Retry", "run_now": "Run now", "cancel": "Cancel", "stop": "Stop", "release": "Release",
         "pause": "Pause", "resume": "Resume"}  # fmt: skip


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


@dataclass
class KeyProposal:
    """An action on the key of selected tasks (pause, resume) as it would be done now."""

    action: str
    key: str
    what: list[str] = field(default_factory=list)
    refusal: str = ""

    @property
    def applies(self) -> bool:
        return not self.refusal


def propose_for_key(action: str, key: str) -> KeyProposal:
    """What pausing or resuming ``key`` would do now, or why it would not (as ``recovery`` refuses it)."""
    paused = operator_gate().is_paused(key)
    if action == "pause":
        if paused:
            return KeyProposal(action, key, refusal=f"key {key!r} is paused already")
        what = f"Key {key!r} dispatches nothing new until it is resumed: its running tasks finish, and new "
        return KeyProposal(action, key, [what + "submissions queue in order."])
    if not paused:
        return KeyProposal(action, key, refusal=f"key {key!r} is not paused")
    return KeyProposal(action, key, [f"Key {key!r} dispatches what waits, up to its limit."])


def why_not(action: str, task: KeyedTask, holder: Holder | None) -> str:
    """Why ``action`` does not apply to ``task`` now ('' when it does; ``holder``: its slot, ``slot_of``):
    each action's own rule, from its home, as the command and the API say it."""
    if action == "retry":
        return recovery.retry_refusal(task)
    if action == "cancel":
        return recovery.cancel_refusal(task, holder)
    if action == "stop":
        return stop.stop_refusal(task, holder)
    if action == "release":
        return recovery.release_refusal(task.key, task.ticket, holder, task.task_id)
    return run_now.run_now_refusal(task)


def available(task: KeyedTask, holder: Holder | None) -> list[str]:
    """The actions that apply to ``task`` in its state (``holder``: its ticket's slot in the gate, if any)."""
    return [action for action in ACTIONS if not why_not(action, task, holder)]


#: The actions the task list does to many selected tasks at once, each confirmed first.
MANY = ("cancel", "retry", "release")


def propose(action: str, task: KeyedTask, *, many: bool = False) -> Proposal:
    """What ``action`` would do to ``task`` now, or why it would not; ``many``: as one of many tasks the task
    list acts on at once, where a running task is not released (it would run again beside itself)."""
    holder = slot_of(task)
    proposal = Proposal(action, task, refusal=why_not(action, task, holder))
    if proposal.refusal:
        return proposal
    if many and action == "release" and holder is not None and holder.state == "running":
        proposal.refusal = recovery.RUNNING_NOT_RELEASED_WITH_OTHERS.format(task=task.task_id)
        return proposal
    _PROPOSED[action](proposal, task, holder, f"{task.task_name}[{task.task_id}]")
    return proposal


def _propose_retry(proposal: Proposal, task: KeyedTask, holder: Holder | None, name: str) -> None:
    if holder is not None and holder.state == "blocked":
        proposal.what = [
            f"{name} failed and blocks key {task.key!r}. It runs again first, as itself (the same task id), "
            "before the tasks waiting behind it."
        ]
        return
    try:
        lookup.stored_message(task, current_app)
    except ActionRefused as refused:
        proposal.refusal = f"{refused}. Submit the task again from your code."
        return
    proposal.what = [
        f"{name} is submitted again as a new task, with the same arguments, at the end of the queue of key "
        f"{task.key!r}.",
        "This record stays as it is and says which task it was retried as.",
    ]


def _propose_cancel(proposal: Proposal, task: KeyedTask, holder: Holder | None, name: str) -> None:
    if holder is not None and holder.state == "blocked":
        proposal.what = [f"{name} failed and blocks key {task.key!r}: it is cancelled, and the key's next task runs."]
        return
    proposal.what = [
        f"{name} leaves the queue of key {task.key!r} and never runs; its record says you cancelled it.",
        "If a worker starts it first, the cancel is refused: release it then.",
    ]


def _propose_run_now(proposal: Proposal, task: KeyedTask, holder: Holder | None, name: str) -> None:
    if task.ticket is None:
        proposal.what = [
            f"{name} joins the queue of key {task.key!r} now, instead of when its countdown or eta is due; it then "
            "waits its turn behind the key's earlier tasks. The message that waits for its eta is dropped when "
            "it comes."
        ]
        return
    proposal.what = [
        f"{name} starts now instead of waiting for {run_now.waits_for(task)}: its message is published again "
        "without an eta, and a worker starts it at once; the copy that waits is dropped when it comes, so it runs "
        "once."
    ]


def _propose_stop(proposal: Proposal, task: KeyedTask, holder: Holder | None, name: str) -> None:
    assert holder is not None  # why_not refuses a stop of a task that holds no slot
    refusal = stop.cannot_end(current_app, task.worker if task.attempts == holder.attempts else "")
    if refusal:
        proposal.refusal = refusal
        return
    proposal.seen = {"ticket": task.ticket or 0, "dispatch": holder.dispatch}
    proposal.choices = {"signal": stop.SIGNALS}
    ran = f" for {since(task.started_at)}" if task.started_at else ""
    where = f" on worker {task.worker}" if task.worker else ""
    proposal.what = [
        f"The run of {name}{ran}{where} (ticket {task.ticket}, attempt {holder.attempts}) is ended: Celery's "
        "worker kills its process with the signal you pick (SIGTERM lets it run its exit handlers; SIGKILL "
        "cannot be ignored).",
        f"Key {task.key!r} keeps it until the run has ended (its worker sees the process gone, or its lease ends): "
        "the next task starts after it, never beside it. The task fails, stopped by you"
        f"{', and blocks its key' if holder.blocks_on_failure else ''}; it is not dispatched again.",
    ]


def _propose_release(proposal: Proposal, task: KeyedTask, holder: Holder | None, name: str) -> None:
    assert holder is not None  # why_not refuses a release of a task that holds no slot
    proposal.seen = {"ticket": task.ticket or 0, "dispatch": holder.dispatch}
    if holder.state == "granted":
        proposal.what = [
            f"{name} was dispatched (ticket {task.ticket}, dispatch {holder.dispatch}) and has not started: its "
            "message is published again; a copy of the old one that reaches a worker later is dropped."
        ]
        return
    ran = f" for {since(task.started_at)}" if task.started_at else ""
    proposal.what = [
        f"Key {task.key!r} is freed from {name}'s run{ran} (ticket {task.ticket}, attempt {holder.attempts}, "
        f"fencing token {holder.token}): the task is dispatched again, as when a lease expires"
        f"{'' if holder.lost < holder.max_lost else ', or fails, having used its recoveries'}.",
        "The released run is not stopped. If it is still executing, it goes on beside the new attempt "
        "until it ends on its own; its lease renewals and its end are refused. Code that checks "
        f"self.holds_key(), or stores self.keyed_lease.token ({holder.token}) with its writes and "
        "refuses older tokens, stays safe.",
    ]
    if "stop" in available(task, holder):
        proposal.instead = "stop"


#: What each action would do, said by its proposer (``propose`` has checked it may be done).
_PROPOSED = {
    "retry": _propose_retry,
    "cancel": _propose_cancel,
    "run_now": _propose_run_now,
    "stop": _propose_stop,
    "release": _propose_release,
}


def perform(
    action: str,
    task: KeyedTask,
    by: str,
    seen: dict[str, int] | None = None,
    picked: dict[str, str] | None = None,
    *,
    many: bool = False,
) -> tuple[str, str | None]:
    """Do ``action`` on ``task``: what was done, and the id of the task that now runs (a retry's, which the
    text then ends by naming), if any.
    ActionRefused if it no longer applies. ``seen``: the ticket and dispatch a release or stop names, as the
    operator confirmed them (None: as they are now); ``picked``: what the operator chose among the
    proposal's ``choices``; ``many``: one of many tasks the task list acts on (see ``propose``)."""
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
    released = recovery.release(task.key, task.ticket, dispatch=dispatch, task_id=task.task_id, by=by, unstarted=many)
    return f"Released by {by} ({', '.join(r.action for r in released if r.ticket == task.ticket)})", None
