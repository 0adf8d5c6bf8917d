"""Operator actions repeated and raced, against each other and against the worker ending the same task:
each race has exactly one effect, and the losers say why (G8)."""

import json
import re
import threading
from collections.abc import Callable

import pytest
from django.db import connections

from django_keyed_queue.exceptions import ActionRefused
from django_keyed_queue.gate import Finish, Lease, Start
from django_keyed_queue.messaging.message import HEADER
from django_keyed_queue.ops.actions import recovery
from django_keyed_queue.process.state import get_gate
from django_keyed_queue.records.models import KeyedTask
from django_keyed_queue.records.transitions import outcome_field
from django_keyed_queue.testing import write_submission_rows
from testproject.demo.tasks import step
from tests.django.queues import QUEUE

pytestmark = pytest.mark.django_db(transaction=True)


def race(*actions: Callable[[], object]) -> list[object]:
    """Run ``actions`` at once, each in a thread of its own; what each returned, or the ActionRefused it raised."""
    outcomes: list[object] = [None] * len(actions)
    barrier = threading.Barrier(len(actions))

    def run(i: int) -> None:
        barrier.wait()
        try:
            outcomes[i] = actions[i]()
        except ActionRefused as refused:
            outcomes[i] = refused
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(actions))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return outcomes


def published(broker) -> list[tuple[str, int, int]]:
    """(task id, ticket, dispatch) of each message on the test queue, oldest first."""
    messages = [json.loads(raw) for raw in reversed(broker.lrange(QUEUE, 0, -1))]
    return [(m["headers"]["id"], m["headers"][HEADER]["ticket"], m["headers"][HEADER]["dispatch"]) for m in messages]


def refusals(outcomes: list[object]) -> list[str]:
    return [str(o) for o in outcomes if isinstance(o, ActionRefused)]


def test_racing_cancels_of_a_dispatched_task_withdraw_it_once_and_grant_the_next_once(gate_redis, broker):
    first, second = (step.apply_async(("k", n), queue=QUEUE) for n in (1, 2))
    write_submission_rows()
    outcomes = race(*[lambda: recovery.cancel(first.id, by="a terminal")] * 4)
    assert len(refusals(outcomes)) == 3, outcomes
    assert published(broker) == [(first.id, 1, 1), (second.id, 2, 1)], "the next task went out once"
    assert KeyedTask.objects.get(task_id=first.id).status == "cancelled"


def test_a_cancel_racing_the_worker_s_start_has_one_effect(gate_redis, broker):
    task = step.apply_async(("k", 1), queue=QUEUE)
    write_submission_rows()
    cancel, start = race(
        lambda: recovery.cancel(task.id, by="an operator"), lambda: get_gate().start(Start("k", 1, 1, task_id=task.id))
    )
    cancelled, started = not isinstance(cancel, ActionRefused), start.ok
    assert cancelled != started, (cancel, start)
    if started:
        assert "stop it instead" in str(cancel), "started before the cancel read it, or meanwhile"
    else:
        assert KeyedTask.objects.get(task_id=task.id).status == "cancelled" and not get_gate().inspect("k").holders


def test_racing_and_repeated_releases_of_a_stuck_holder_dispatch_it_again_once(gate_redis, broker):
    task = step.apply_async(("k", 1), queue=QUEUE)
    get_gate().start(Start("k", 1, 1, max_lost=3))
    # Four clicks of the live page's button, which names the dispatch it showed, and two terminals.
    clicks = [lambda: recovery.release("k", 1, dispatch=1, by="a click")] * 4
    outcomes = race(*clicks, *[lambda: recovery.release("k", 1, by="a terminal")] * 2)
    assert len(refusals(outcomes)) == 5, outcomes
    with pytest.raises(
        ActionRefused, match=r"was dispatched (\d+\.\d)s ago and a worker may be starting it"
    ) as refused:
        recovery.release("k", 1, by="a terminal, again")
    # Just now (a loaded machine, as under ``make check``'s two workers, takes a few tenths to get here).
    assert float(re.search(r"dispatched (\d+\.\d)s ago", str(refused.value)).group(1)) < 5
    assert published(broker) == [(task.id, 1, 1), (task.id, 1, 2)], "dispatched again once"


def test_a_release_racing_the_worker_s_finish_has_one_effect(gate_redis, broker):
    step.apply_async(("k", 1), queue=QUEUE)
    step.apply_async(("k", 2), queue=QUEUE)
    token = get_gate().start(Start("k", 1, 1, max_lost=3)).token
    release, finish = race(lambda: recovery.release("k", 1), lambda: get_gate().finish(Finish("k", 1, token)))
    released = not isinstance(release, ActionRefused)
    assert released != finish.ok, (release, finish)
    holders = get_gate().inspect("k").holders
    if released:  # the run is fenced: its finish ended nothing, and its ticket runs again
        assert not get_gate().holds(Lease("k", 1, token)) and holders[1].state == "granted"
    else:
        assert ("holds no slot" in str(release) or "moved on" in str(release)) and list(holders) == [2]
        assert [g.ticket for g in finish.granted] == [2], "the finish passed the key on (its worker publishes it)"


def test_racing_resumes_dispatch_once(gate_redis, broker):
    recovery.pause("k")
    tasks = [step.apply_async(("k", n), queue=QUEUE) for n in (1, 2)]
    outcomes = race(*[lambda: recovery.resume("k", by="a terminal")] * 3)
    assert sorted(map(repr, outcomes)).count("None") == 2, f"two are told it was not paused: {outcomes}"
    assert published(broker) == [(tasks[0].id, 1, 1)]
    assert not get_gate().is_paused("k")


def test_racing_confirmations_on_the_task_page_release_once_and_retry_once(gate_redis, broker, django_user_model):
    """Four operators confirm the same release (the dispatch they were shown), then the same retry, at once."""
    from django.contrib import messages as flash
    from django.test import Client
    from django.urls import reverse

    admin = django_user_model.objects.create_superuser("admin", "admin@example.com", "pw")
    held = step.apply_async(("k", 1), queue=QUEUE)
    write_submission_rows()
    task = KeyedTask.objects.get(task_id=held.id)
    assert get_gate().start(Start("k", task.ticket, 1, max_lost=3)).ok

    def confirm(action: str, form: dict) -> Callable[[], str]:
        def post() -> str:
            client = Client()
            client.force_login(admin)
            response = client.post(reverse("admin:keyed_queue_task_act", args=[task.pk, action]), form, follow=True)
            return " ".join(str(m) for m in flash.get_messages(response.wsgi_request)) or response.content.decode()

        return post

    said = race(*[confirm("release", {"ticket": task.ticket, "dispatch": 1})] * 4)
    assert sum("Released by admin (redispatch)" in s for s in said) == 1, said
    assert sum("moved on from dispatch 1" in s for s in said) == 3, said
    assert get_gate().inspect("k").holders[task.ticket].dispatch == 2, "released once"

    started = get_gate().start(Start("k", task.ticket, 2))
    get_gate().finish(Finish("k", task.ticket, started.token))
    KeyedTask.objects.filter(pk=task.pk).update(status="failed", error="boom")
    said = race(*[confirm("retry", {})] * 4)
    [again] = KeyedTask.objects.exclude(pk=task.pk)
    assert sum("Retried by admin as <a href=" in s and f">{again.task_id}</a>" in s for s in said) == 1, said
    assert sum(f"was retried already: it runs again as task {again.task_id}" in s for s in said) == 3, said


@pytest.mark.parametrize("fails", [False, True], ids=["succeeded", "failed and blocks its key"])
def test_pages_writing_a_kept_end_racing_its_worker_s_write_leave_the_end_once(gate_redis, broker, fails):
    """A run's end is written by its worker's records pass, and by a page or action that reads the row first
    (``with_kept_end``) while the gate keeps the end: both at once, several times over, write it once."""
    from django_keyed_queue.process.state import current
    from django_keyed_queue.records.submissions import with_kept_end
    from django_keyed_queue.worker.run import Run, failure_text
    from testproject.demo.tasks import ledger_entry

    task_of, refused = (ledger_entry if fails else step), RuntimeError("the ledger refused it")
    for n in range(4):
        key = f"ledger:{n}"
        result = task_of.apply_async((key, 1), queue=QUEUE)
        write_submission_rows()
        row = KeyedTask.objects.get(task_id=result.id)
        started = get_gate().start(Start(key, row.ticket, 1, task_id=result.id))
        task_of.push_request(id=result.id)
        try:
            run = Run(task_of, Lease(key, row.ticket, started.token), attempts=1)
            assert run.fail(refused) if fails else run.succeed()
        finally:
            task_of.pop_request()
        assert KeyedTask.objects.get(pk=row.pk).status == "dispatched", "the end is in its worker's buffer"

        def page(pk: int = row.pk) -> object:
            try:
                return with_kept_end(get_gate, KeyedTask.objects.get(pk=pk))
            except Exception as error:  # the race's threads would only print it
                return error

        def worker() -> object:
            try:
                return current().recorder.flush()
            except Exception as error:
                return error

        outcomes = race(page, page, worker)
        assert not [o for o in outcomes if isinstance(o, Exception)], outcomes
        after = KeyedTask.objects.get(pk=row.pk)
        assert (after.status, after.attempts, after.notes) == ("failed" if fails else "succeeded", 1, "")
        assert after.error == (failure_text(refused) if fails else ""), "written once, not appended to"
        assert after.finished_at is not None
        assert get_gate().kept_outcome(key, outcome_field(result.id, row.ticket)) is None, "the worker forgot it"
        assert with_kept_end(get_gate, after) == after and KeyedTask.objects.get(pk=row.pk).error == after.error
