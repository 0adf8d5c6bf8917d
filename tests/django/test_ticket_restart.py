"""A run has one identity everywhere: a key's tickets start over at 1 once it drains, its older records keep
their tickets, and every page, command, action and log entry still names the task that truly holds it."""

import io
import re
from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone

from django_keyed_queue import explain
from django_keyed_queue.gate import Finish, Start
from django_keyed_queue.gate.keys import KeyNames
from django_keyed_queue.ops.actions import lookup, task_actions
from django_keyed_queue.ops.console.live import live_keys
from django_keyed_queue.ops.console.timeline import key_timeline
from django_keyed_queue.process.state import get_gate
from django_keyed_queue.records.models import KeyedTask
from django_keyed_queue.testing import write_submission_rows
from testproject.demo.tasks import step
from tests.django.queues import QUEUE

pytestmark = pytest.mark.django_db

KEY = "account:9"
STEP = "testproject.demo.tasks.step"


def submit(*ns: int) -> list[str]:
    ids = [step.apply_async((KEY, n), queue=QUEUE).id for n in ns]
    write_submission_rows()
    return ids


def run(task_id: str, ticket: int, *, worker: str, ran_for: float):
    """The gate's start of ``ticket`` for ``task_id``, and the record its worker writes."""
    started = get_gate().start(Start(KEY, ticket, 1, task_id=task_id, max_lost=3))
    assert started.ok
    ran = KeyedTask.objects.filter(task_id=task_id).update(
        status="running", started_at=timezone.now() - timedelta(seconds=ran_for), worker=worker, attempts=1
    )
    assert ran == 1, f"the row of {task_id} is written"
    return started


@pytest.fixture
def restarted(gate_redis, broker) -> tuple[str, str, str]:
    """An old task that ran as ticket 1 and succeeded; the key drained past its idle horizon; then a new
    task holds ticket 1 again (running 20 s on w1) with another waiting behind it. Their ids."""
    [old] = submit(1)
    started = run(old, 1, worker="celery@w2", ran_for=400)
    assert get_gate().finish(Finish(KEY, 1, started.token)).ok
    ended = KeyedTask.objects.filter(task_id=old).update(
        status="succeeded", finished_at=timezone.now() - timedelta(minutes=6)
    )
    assert ended == 1
    gate_redis.pexpire(KeyNames(KEY).meta, 1)  # what the idle horizon does to a drained key
    while gate_redis.exists(KeyNames(KEY).meta):
        pass
    assert get_gate().inspect(KEY).last_ticket == 0, "the drained key keeps nothing"
    new, behind = submit(2, 3)
    assert KeyedTask.objects.get(task_id=new).ticket == 1, "its tickets started over"
    run(new, 1, worker="celery@w1", ran_for=20)
    return old, new, behind


def test_why_a_task_waits_names_the_new_holder_not_the_old_record_of_its_ticket(restarted):
    old, new, behind = restarted
    why = explain(behind)
    [holder] = why.holders
    assert holder.task is not None and holder.task.task_id == new
    # Running for 20 s when the fixture ended, and a little more since (a busy machine: seconds more).
    assert re.search(
        rf"{re.escape(f'{STEP}[{new}]')} holds the key: running for 2\d\.\d s on celery@w1", why.reasons[0]
    )
    assert old not in str(why) and "celery@w2" not in str(why)

    mine = explain(new)
    assert mine.state == "running" and mine.own_slot is not None and "on celery@w1" in mine.reasons[0]
    ended = explain(old)
    assert ended.state == "succeeded" and ended.own_slot is None, "the old record holds nothing"


def test_no_action_is_offered_on_the_old_record_and_its_release_is_refused(restarted):
    old, new, _ = restarted
    old_row = KeyedTask.objects.get(task_id=old)
    assert lookup.slot_of(old_row) is None
    assert task_actions.available(old_row, lookup.slot_of(old_row)) == []
    assert task_actions.propose("release", old_row).refusal
    assert lookup.slot_of(KeyedTask.objects.get(task_id=new)).state == "running"


def test_the_live_page_release_and_the_admin_log_name_the_new_holder(restarted, as_user):
    old, new, _ = restarted
    staff_client = as_user("rob", "release_keyedtask")
    [state] = live_keys(search=KEY).states
    [holder] = state.holders
    assert (holder.task.task_id, holder.task_id, holder.task.worker) == (new, new, "celery@w1")

    page = staff_client.get(reverse("admin:keyed_queue_keys"), {"key": KEY}).content.decode()
    assert f"{STEP}[{new}]" in page and old not in page
    new_row = KeyedTask.objects.get(task_id=new)
    confirm_url = reverse("admin:keyed_queue_task_act", args=[new_row.pk, "release"])
    confirm = staff_client.get(confirm_url).content.decode()
    assert f"{STEP}[{new}]" in confirm
    assert re.search(r"run for 2\d\.\d s", confirm)
    assert old not in confirm

    holder_now = get_gate().inspect(KEY).holders[1]
    done = staff_client.post(confirm_url, {"ticket": 1, "dispatch": holder_now.dispatch}, follow=True)
    said = [str(m) for m in done.context["messages"]]
    assert said == [f"{STEP}[{new}]: Released by rob (redispatch)"], said
    [entry] = LogEntry.objects.filter(change_message__startswith="Released by")
    assert entry.object_id == str(new_row.pk), "the audit log names the task that held the key"


def test_a_release_naming_the_old_task_frees_nothing(restarted, as_user):
    old, _, _ = restarted
    response = as_user("rob", "release_keyedtask").post(
        reverse("admin:keyed_queue_key_act"),
        {"action": "release", "key": KEY, "ticket": 1, "dispatch": 1, "task_id": old},
        follow=True,
    )
    assert f"holds no slot for task {old}" in response.content.decode()
    assert get_gate().inspect(KEY).holders[1].state == "running", "the new holder runs on"


def test_the_commands_name_the_new_holder(restarted):
    old, new, _ = restarted
    out = io.StringIO()
    call_command("keyed_queue_status", "--key", KEY, stdout=out)
    assert f"holder {STEP}[{new}] (ticket 1): running" in out.getvalue() and old not in out.getvalue()
    out = io.StringIO()
    call_command("keyed_queue_release", KEY, stdout=out)
    assert out.getvalue().startswith(f"released {STEP}[{new}] (ticket 1) of key {KEY!r}: redispatch")


def test_the_timeline_tells_the_series_of_tickets_apart(restarted):
    old, new, behind = restarted
    timeline = key_timeline(KeyedTask.objects.get(task_id=new))
    assert [b.task_id for b in timeline.bars] == [old, new, behind], "each series in order, the older first"
    rows = KeyedTask.objects.order_by("id").values_list("task_id", "ticket", "enqueued_at", "finished_at")
    assert [b.restarts for b in timeline.bars] == [False, True, False], list(rows)
    assert [b.label for b in timeline.bars] == ["#1 succeeded", "#1 running", "#2 waiting"]


def test_tickets_taken_in_one_ms_whose_rows_were_written_in_another_order_keep_their_series(restarted):
    """A submissions' writer writes a batch of rows in any order: the task behind can have the lower row id,
    and both joined in the same ms. The timeline follows the tickets."""
    old, new, behind = restarted
    KeyedTask.objects.filter(task_id=behind).update(enqueued_at=KeyedTask.objects.get(task_id=new).enqueued_at)
    row = KeyedTask.objects.get(task_id=new)
    row.delete()
    row.pk = None
    row.save()  # written after the row behind it
    timeline = key_timeline(KeyedTask.objects.get(task_id=new))
    assert [(b.task_id, b.restarts) for b in timeline.bars] == [(old, False), (new, True), (behind, False)]


def test_a_worker_clock_ahead_of_the_gate_s_still_tells_the_series_apart(restarted):
    """The old run's end is written by its worker's clock, the new submission's time by the gate's: a worker
    a few ms ahead writes an end after the next series joined, and the timeline still splits at the ticket 1."""
    old, new, behind = restarted
    joined = KeyedTask.objects.get(task_id=new).enqueued_at
    KeyedTask.objects.filter(task_id=old).update(finished_at=joined + timedelta(milliseconds=5))
    timeline = key_timeline(KeyedTask.objects.get(task_id=new))
    assert [(b.task_id, b.restarts) for b in timeline.bars] == [(old, False), (new, True), (behind, False)]


@pytest.mark.parametrize("task_id", ["\x00", "x" * 100_000, "é\x00" * 3])
def test_a_release_naming_a_task_id_no_database_can_store_is_refused_whole(restarted, as_user, task_id):
    response = as_user("rob", "release_keyedtask").post(
        reverse("admin:keyed_queue_key_act"),
        {"action": "release", "key": KEY, "ticket": 1, "dispatch": 1, "task_id": task_id},
    )
    assert response.status_code == 400 and b"task id" in response.content
    assert get_gate().inspect(KEY).holders[1].state == "running" and not LogEntry.objects.exists()
