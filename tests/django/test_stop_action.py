"""Stop from the task's page and from ``keyed_queue_stop``: what it will do first, then one stop of the run
however often it is clicked or raced, noted at the gate and in the audit log; refused, with nothing done,
where it does not apply."""

import io
import threading

import pytest
from django.contrib.admin.models import LogEntry
from django.core.cache import cache
from django.core.management import CommandError, call_command
from django.db import connections
from django.urls import reverse
from django.utils import timezone

from django_keyed_queue import ActionRefused
from django_keyed_queue.gate import Start
from django_keyed_queue.ops.actions import stop
from django_keyed_queue.process.state import get_gate
from django_keyed_queue.records.models import KeyedTask
from django_keyed_queue.testing import write_submission_rows
from testproject.demo.tasks import step
from tests.django.queues import QUEUE

pytestmark = pytest.mark.django_db


#: The worker the tests' runs are recorded on; no such worker runs, so its pool is told as it would answer.
WORKER = "celery@host-a"


def running_task(key: str = "k", n: int = 1, worker: str = WORKER, pool: str | None = "prefork") -> KeyedTask:
    """A task whose run started, as a worker starts it (the revoke reaches no worker here); ``pool``: what
    its worker answers Celery's inspect (None: it does not answer)."""
    if pool is None:
        cache.delete(f"keyed_queue:pool:{worker}")
    else:
        cache.set(f"keyed_queue:pool:{worker}", pool, 60)
    result = step.apply_async((key, n), queue=QUEUE)
    write_submission_rows()
    task = KeyedTask.objects.get(task_id=result.id)
    assert get_gate().start(Start(key, task.ticket, 1)).ok
    KeyedTask.objects.filter(pk=task.pk).update(status="running", attempts=1, started_at=timezone.now(), worker=worker)
    return KeyedTask.objects.get(pk=task.pk)


def act_url(task: KeyedTask, action: str) -> str:
    return reverse("admin:keyed_queue_task_act", args=[task.pk, action])


def stopping_of(task: KeyedTask):
    return get_gate().inspect(task.key).holders[task.ticket].stopping


def test_the_task_page_offers_stop_says_what_it_does_and_stops_once(gate_redis, broker, as_user):
    task = running_task()
    client = as_user("sam", "stop_keyedtask", "release_keyedtask")
    page = client.get(reverse("admin:keyed_queue_keyedtask_change", args=[task.pk])).content.decode()
    assert act_url(task, "stop") in page
    confirm = client.get(act_url(task, "stop")).content.decode()
    assert "never beside it" in confirm and '<option value="SIGKILL">' in confirm
    assert stopping_of(task) is None, "showing what it does does nothing"

    done = client.post(act_url(task, "stop"), {"ticket": task.ticket, "dispatch": 1, "signal": "SIGKILL"}, follow=True)

    assert "SIGKILL sent to worker celery@host-a" in done.content.decode()
    noted = stopping_of(task)
    assert (noted.by, noted.how) == ("sam", "SIGKILL")
    assert LogEntry.objects.get(object_id=str(task.pk)).change_message.startswith(f"SIGKILL sent to worker {WORKER}")
    again = client.post(act_url(task, "stop"), {"ticket": task.ticket, "dispatch": 1, "signal": "SIGTERM"}, follow=True)
    assert "it was being stopped by sam (SIGKILL) already, since " in again.content.decode()
    assert stopping_of(task) == noted, "a second stop changes nothing of the first"
    assert get_gate().inspect(task.key).holders[task.ticket].state == "running", "the key waits for the run's end"
    explained = client.get(reverse("admin:keyed_queue_keyedtask_change", args=[task.pk])).content.decode()
    assert "it is being ended: stopped by sam (SIGKILL)" in explained


def test_release_of_a_running_task_offers_stop_instead(gate_redis, broker, as_user):
    task = running_task()
    confirm = as_user("sam", "stop_keyedtask", "release_keyedtask").get(act_url(task, "release")).content.decode()
    assert 'id="instead"' in confirm and act_url(task, "stop") in confirm
    only_release = as_user("rae", "release_keyedtask").get(act_url(task, "release")).content.decode()
    assert 'id="instead"' not in only_release, "offered only to who may stop"


@pytest.mark.parametrize(
    "form, refusal",
    [
        ({"signal": "SIGHUP", "dispatch": 1}, "a run is stopped with SIGTERM or SIGKILL, not 'SIGHUP'"),
        ({"signal": "SIGTERM", "dispatch": 2}, "moved on from the attempt you saw (dispatch 2, now 1)"),
        ({"signal": "SIGTERM", "dispatch": 1, "ticket": 9}, "the stop names no ticket and dispatch of this task"),
    ],
)
def test_a_stop_that_does_not_apply_is_refused_and_does_nothing(gate_redis, broker, as_user, form, refusal):
    task = running_task()
    posted = {"ticket": task.ticket, **form}
    text = as_user("sam", "stop_keyedtask").post(act_url(task, "stop"), posted, follow=True).content.decode()
    assert refusal.replace("'", "&#x27;")[1:] in text  # the message begins with a capital
    assert stopping_of(task) is None and not LogEntry.objects.exists()


def test_only_a_running_task_is_stopped(gate_redis, broker, as_user):
    task = running_task()
    behind = step.apply_async(("k", 2), queue=QUEUE)
    write_submission_rows()
    waiting = KeyedTask.objects.get(task_id=behind.id)
    confirm = as_user("sam", "stop_keyedtask").get(act_url(waiting, "stop")).content.decode()
    assert f"Stop does not apply now: task {waiting.task_id} is not running" in confirm
    with pytest.raises(ActionRefused, match="is not running"):
        stop.stop(waiting.task_id, by="sam")
    assert stopping_of(task) is None


def test_stop_needs_its_own_permission(gate_redis, broker, as_user):
    task = running_task()
    client = as_user("rae", "release_keyedtask", "cancel_keyedtask", "retry_keyedtask")
    assert client.post(act_url(task, "stop"), {"ticket": task.ticket, "dispatch": 1}).status_code == 403
    assert (
        act_url(task, "stop")
        not in client.get(reverse("admin:keyed_queue_keyedtask_change", args=[task.pk])).content.decode()
    )
    assert stopping_of(task) is None


@pytest.mark.django_db(transaction=True)
def test_racing_stops_stop_the_run_once(gate_redis, broker):
    task = running_task()
    said, errors = [], []

    def stop_it(by: str) -> None:
        try:
            said.append(stop.stop(task.task_id, by=by, dispatch=1).stopping)
        except Exception as exc:  # noqa: BLE001  # reported below
            errors.append(exc)
        finally:
            connections.close_all()  # this thread's own

    threads = [threading.Thread(target=stop_it, args=(f"op{n}",)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and len(said) == 6
    assert len(set(said)) == 1, "every stop names the first, whichever it was"
    assert stopping_of(task) == said[0]


def test_the_stop_command_says_what_it_sent_and_refuses_a_task_that_does_not_run(gate_redis, broker):
    task = running_task()
    out = io.StringIO()
    call_command("keyed_queue_stop", task.task_id, "--signal", "SIGKILL", stdout=out)
    said = "SIGKILL sent to worker celery@host-a to end the run of"
    assert out.getvalue().startswith(f"{said} {task.task_name}[{task.task_id}]")
    assert stopping_of(task).by.endswith("(manage.py keyed_queue_stop)")
    with pytest.raises(CommandError, match="no keyed task has the id 'nope'"):
        call_command("keyed_queue_stop", "nope")
    with pytest.raises(CommandError, match="no keyed task has the id"):
        call_command("keyed_queue_stop", "a\x00b")


def test_the_live_keys_page_offers_stop_and_says_a_run_is_being_ended(gate_redis, broker, as_user):
    task = running_task(key="live:1")
    keys = reverse("admin:keyed_queue_keys")
    client = as_user("sam", "view_keyedtask", "stop_keyedtask")
    page = client.get(keys).content.decode()
    assert f"{act_url(task, 'stop')}?next=" in page and f"Stop {task.task_id[:8]}…" in page
    stop.stop(task.task_id, by="sam", signal="SIGKILL")
    assert "being ended: stopped by sam (SIGKILL)" in client.get(keys).content.decode()
    viewer = as_user("vic", "view_keyedtask").get(keys).content.decode()
    assert f"Stop {task.task_id[:8]}…" not in viewer, "offered only to who may stop"


@pytest.mark.parametrize(
    "worker, pool, refusal",
    [
        ("", "prefork", "its worker is not recorded yet"),
        ("celery@busy-solo", None, "worker celery@busy-solo did not say within 1 s which of Celery's pools it runs"),
        ("celery@solo", "solo", "worker celery@solo runs Celery's solo pool, which cannot end one running task"),
        ("celery@green", "gevent", "worker celery@green runs Celery's gevent pool"),
    ],
)
def test_stop_is_refused_where_its_worker_cannot_be_known_to_end_the_run(gate_redis, broker, as_user, worker, pool,
                                                                         refusal):  # fmt: skip
    task = running_task(worker=worker, pool=pool)
    with pytest.raises(ActionRefused, match=refusal):
        stop.stop(task.task_id, by="sam")
    confirm = as_user("sam", "stop_keyedtask").get(act_url(task, "stop")).content.decode()
    assert "Stop does not apply now: " + refusal.replace("'", "&#x27;") in confirm, "the page says the same"
    with pytest.raises(CommandError, match=refusal):
        call_command("keyed_queue_stop", task.task_id)
    assert stopping_of(task) is None, "nothing noted at the gate"
