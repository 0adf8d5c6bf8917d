"""The task's own page: why it waits, its actions (each shown before it is done), its links, refusals."""

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.urls import reverse
from django.utils import timezone
from django.utils.encoding import iri_to_uri
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_keyed_queue import ActionRefused, explain
from django_keyed_queue.gate import Finish, Lease, Start
from django_keyed_queue.gate.keys import KeyNames
from django_keyed_queue.process.state import get_gate
from django_keyed_queue.records.models import IdempotencyKey, KeyedTask
from django_keyed_queue.records.transitions import outcome_field
from django_keyed_queue.testing import write_submission_rows
from django_keyed_queue.worker.run import Run
from testproject.demo.tasks import charge, ledger_entry, step
from tests.django.queues import QUEUE

pytestmark = pytest.mark.django_db


def page_of(task: KeyedTask) -> str:
    return reverse("admin:keyed_queue_keyedtask_change", args=[task.pk])


def act_url(task: KeyedTask, action: str) -> str:
    return reverse("admin:keyed_queue_task_act", args=[task.pk, action])


def submitted(key: str, n: int) -> KeyedTask:
    result = step.apply_async((key, n), queue=QUEUE)
    write_submission_rows()
    return KeyedTask.objects.get(task_id=result.id)


def failed_charge() -> KeyedTask:
    """A charge that failed; its worker kept its message, as a failed run's record does."""
    result = charge.apply_async((7, "10.00"), queue=QUEUE)
    write_submission_rows()
    task = KeyedTask.objects.get(task_id=result.id)
    started = get_gate().start(Start(task.key, task.ticket, 1))
    get_gate().finish(Finish(task.key, task.ticket, started.token))
    KeyedTask.objects.filter(pk=task.pk).update(status="failed", error="CardDeclined", finished_at=timezone.now())
    return KeyedTask.objects.get(pk=task.pk)


def test_a_waiting_tasks_page_says_what_holds_it_and_links_the_holder(gate_redis, broker, admin_client):
    first, second = submitted("account:6", 1), submitted("account:6", 2)
    assert get_gate().start(Start("account:6", first.ticket, 1)).ok
    KeyedTask.objects.filter(pk=first.pk).update(
        status="running", started_at=timezone.now() - timedelta(seconds=75), worker="celery@a"
    )
    text = admin_client.get(page_of(second)).content.decode()
    assert "Why it waits</h2>" in text or "Why it waits: waiting" in text
    assert f'<a href="{page_of(first)}">testproject.demo.tasks.step[{first.task_id}]</a>' in text
    assert "it is next in its key&#x27;s queue" in text
    assert re.search(r'waiting for <span class="kq-since" data-since="\d+">', text), "the wait ticks"
    mine = admin_client.get(page_of(first)).content.decode()
    assert "What it does now: running" in mine and "running for 1 min 15 s on celery@a" in mine
    assert re.search(r'running for <span class="kq-since" data-since="\d+">1 min 1\d s</span>', mine)


def test_retry_from_the_task_page_says_what_it_does_then_does_it_once(gate_redis, broker, as_user):
    failed = failed_charge()
    client = as_user("rita", "retry_keyedtask")
    page = client.get(page_of(failed)).content.decode()
    assert f'href="{act_url(failed, "retry")}" id="act-retry">Retry…' in page
    assert 'id="act-cancel"' not in page and 'id="act-release"' not in page

    confirm = client.get(act_url(failed, "retry")).content.decode()
    assert "is submitted again as a new task, with the same arguments, at the end of the queue of key" in confirm
    assert KeyedTask.objects.count() == 1, "nothing done by looking"

    done = client.post(act_url(failed, "retry"), follow=True)
    [again] = KeyedTask.objects.exclude(pk=failed.pk)
    assert f'Retried by rita as <a href="{page_of(again)}">{again.task_id}</a>' in done.content.decode()
    assert done.redirect_chain[-1][0] == page_of(failed)
    assert f'<a href="{page_of(again)}">{again.task_id}</a>' in done.content.decode(), "retried as, linked"
    assert f'<a href="{page_of(failed)}">{failed.task_id}</a>' in client.get(page_of(again)).content.decode()

    twice = client.post(act_url(failed, "retry"), follow=True)
    assert f"was retried already: it runs again as task {again.task_id}" in twice.content.decode()
    assert KeyedTask.objects.count() == 2, "a second click retries nothing more"


def test_a_task_whose_message_was_not_kept_says_so_before_the_click(gate_redis, broker, admin_client):
    failed = failed_charge()
    KeyedTask.objects.filter(pk=failed.pk).update(message="")
    confirm = admin_client.get(act_url(failed, "retry")).content.decode()
    assert "Retry does not apply now: task" in confirm
    assert "its message (what it ran with) was not kept. Submit the task again from your code." in confirm
    assert 'id="confirm"' not in confirm


def test_release_from_the_task_page_names_the_fencing_token_and_frees_that_run_once(gate_redis, broker, as_user):
    running = submitted("report:monthly", 1)
    started = get_gate().start(Start("report:monthly", running.ticket, 1, max_lost=3))
    KeyedTask.objects.filter(pk=running.pk).update(status="running", started_at=timezone.now())
    client = as_user("rob", "release_keyedtask")
    confirm = client.get(act_url(running, "release")).content.decode()
    assert f"fencing token {started.token}" in confirm and "The released run is not stopped" in confirm
    assert '<input type="hidden" name="dispatch" value="1">' in confirm

    form = {"ticket": running.ticket, "dispatch": 1}
    done = client.post(act_url(running, "release"), form, follow=True).content.decode()
    assert "Released by rob (redispatch)" in done
    assert get_gate().inspect("report:monthly").holders[running.ticket].dispatch == 2
    again = client.post(act_url(running, "release"), form, follow=True).content.decode()
    assert "moved on from dispatch 1" in again, "the second click frees nothing"
    assert get_gate().inspect("report:monthly").holders[running.ticket].dispatch == 2
    missing = client.post(act_url(running, "release"), {}, follow=True)
    assert "The release names no ticket and dispatch of this task" in missing.content.decode()


def test_cancel_from_the_task_page_goes_back_where_the_operator_came_from(gate_redis, broker, admin_client):
    first, second = submitted("k", 1), submitted("k", 2)
    live = reverse("admin:keyed_queue_keys") + "?key=k"
    confirm = admin_client.get(act_url(second, "cancel") + "?next=" + live.replace("?", "%3F").replace("=", "%3D"))
    assert f'name="next" value="{live}"' in confirm.content.decode()
    done = admin_client.post(act_url(second, "cancel"), {"next": live}, follow=True)
    assert done.redirect_chain[-1][0] == live
    assert KeyedTask.objects.get(pk=second.pk).status == "cancelled"
    elsewhere = admin_client.post(act_url(first, "cancel"), {"next": "https://elsewhere.example/"}, follow=True)
    assert elsewhere.redirect_chain[-1][0] == page_of(first), "never sent off the site"


def test_a_viewer_is_told_what_they_may_not_do_with_403(gate_redis, broker, as_user):
    failed = failed_charge()
    client = as_user("vic")
    for method in (client.get, client.post):
        refused = method(act_url(failed, "retry"))
        assert refused.status_code == 403
        assert "You may view keyed tasks but not retry them." in refused.content.decode()
    forced = client.post(reverse("admin:keyed_queue_keyedtask_changelist"), {"action": "retry_tasks"})
    assert forced.status_code == 403 and "but not run the action" in forced.content.decode()
    keyed = client.post(reverse("admin:keyed_queue_key_act"), {"action": "pause", "key": "k"})
    assert keyed.status_code == 403 and "You may view keyed tasks but not pause keys." in keyed.content.decode()
    assert KeyedTask.objects.get(pk=failed.pk).retried_as == "" and not get_gate().inspect("k").paused
    assert 'id="act-retry"' not in client.get(page_of(failed)).content.decode()


@pytest.mark.parametrize("action", ["delete", "reset", "Retry"])
def test_an_unknown_action_is_a_bad_request(gate_redis, admin_client, action):
    task = submitted("k", 1)
    assert admin_client.get(f"{page_of(task).removesuffix('change/')}act/{action}/").status_code == 400


def test_the_timeline_lists_tasks_in_ticket_order_each_a_link(gate_redis, broker, admin_client):
    tasks = [submitted("k", n) for n in range(3)]
    # Records written out of order (a worker's batch before the producer's): ids no longer follow tickets.
    KeyedTask.objects.filter(pk=tasks[2].pk).update(ticket=-1)
    KeyedTask.objects.filter(pk=tasks[0].pk).update(ticket=3)
    KeyedTask.objects.filter(pk=tasks[2].pk).update(ticket=1)
    text = admin_client.get(page_of(tasks[1])).content.decode()
    labels = re.findall(r"<text [^>]*>#(\d+) ", text)
    assert labels == ["1", "2", "3"]
    links = re.findall(r'<a href="([^"]+)">\s*<g class="timeline-task', text)
    assert links == [page_of(tasks[2]), page_of(tasks[1]), page_of(tasks[0])]
    assert "in ticket order" in text


def test_the_idempotency_key_page_reads_as_read_only_with_its_task_linked(gate_redis, broker, admin_client):
    charge.apply_async((9, "1.00"), queue=QUEUE)
    write_submission_rows()
    key = IdempotencyKey.objects.get()
    task = KeyedTask.objects.get(task_id=key.task_id)
    text = admin_client.get(reverse("admin:keyed_queue_idempotencykey_change", args=[key.pk])).content.decode()
    assert "<h1>View idempotency key</h1>" in text and 'name="_save"' not in text
    assert f'<a href="{page_of(task)}">{key.task_id}</a>' in text


def test_the_admin_home_page_links_the_live_keys_page_for_who_may_view_keyed_tasks(gate_redis, as_user, client):
    viewer = as_user("vic")
    home = viewer.get(reverse("admin:index")).content.decode()
    entry = reverse("admin:keyed_queue_livekey_changelist")
    assert f'<a href="{entry}">Live keys</a>' in home
    assert viewer.get(entry, follow=True).redirect_chain[-1][0] == reverse("admin:keyed_queue_keys")
    client.force_login(User.objects.create_user("sam", password="pw", is_staff=True))
    assert entry not in client.get(reverse("admin:index")).content.decode()


ODD_TEXT = st.one_of(
    st.text(max_size=50),
    st.sampled_from(["", "0", "-1", "1e3", "²", "9" * 40, "\x00", "%00", "../", "//elsewhere.example", "javascript:x"]),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ticket=ODD_TEXT, dispatch=ODD_TEXT, back=ODD_TEXT)
def test_a_confirmation_posted_with_any_values_never_errs_and_frees_only_the_dispatch_shown(
    gate_redis, admin_client, ticket, dispatch, back
):
    gate_redis.flushdb()
    KeyedTask.objects.all().delete()
    task = submitted("k", 1)
    assert get_gate().start(Start("k", task.ticket, 1, max_lost=3)).ok
    response = admin_client.post(act_url(task, "release"), {"ticket": ticket, "dispatch": dispatch, "next": back})
    assert response.status_code == 302
    assert response["Location"] in (page_of(task), iri_to_uri(back)), "the task's page, or a page of this site"
    assert response["Location"].startswith("/") and not response["Location"].startswith("//")
    released = get_gate().inspect("k").holders[task.ticket].dispatch == 2
    assert released == (ticket == str(task.ticket) and dispatch == "1"), (ticket, dispatch)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(task_id=st.text(max_size=300))
def test_explain_answers_any_task_id_or_refuses_it_by_name(gate_redis, task_id):
    try:
        explain(task_id)
    except ActionRefused as refused:
        assert "no keyed task has the id" in str(refused)


def test_a_failed_task_that_blocks_its_key_offers_retry_and_cancel_on_its_page(gate_redis, broker, admin_client):
    failed, waiting = submitted("k", 1), submitted("k", 2)
    started = get_gate().start(Start("k", failed.ticket, 1, block=True))
    assert get_gate().finish(Finish("k", failed.ticket, started.token, block=True)).code.name == "BLOCKED"
    KeyedTask.objects.filter(pk=failed.pk).update(status="failed", error="boom")
    page = admin_client.get(page_of(failed)).content.decode()
    assert 'id="act-retry"' in page and 'id="act-cancel"' in page and 'id="act-release"' not in page
    assert f"[{failed.task_id}] failed and blocks the key" in admin_client.get(page_of(waiting)).content.decode()


def test_a_run_that_failed_and_blocks_its_key_shows_so_before_its_worker_writes_its_end(
    gate_redis, broker, admin_client
):
    """Its worker writes the run's end within a pass (``KEYED_QUEUE_RECORD_FLUSH_SECONDS``); the gate keeps the
    end from the finish on, and names the key blocked by it. The task's page and its retry say so at once."""
    failed = ledger_entry.apply_async(("ledger:7", 1), queue=QUEUE)
    write_submission_rows()
    gate = get_gate()
    started = gate.start(Start("ledger:7", 1, 1, task_id=failed.id))
    ledger_entry.push_request(id=failed.id)
    try:
        Run(ledger_entry, Lease("ledger:7", 1, started.token), attempts=1).fail(RuntimeError("the ledger refused it"))
    finally:
        ledger_entry.pop_request()
    assert gate.inspect("ledger:7").blocked is not None
    row = KeyedTask.objects.get(task_id=failed.id)
    assert row.status == "dispatched", "its worker's writes are still in its buffer"

    page = admin_client.get(page_of(row)).content.decode()
    assert 'id="act-retry"' in page and 'id="act-cancel"' in page
    retry = admin_client.get(reverse("admin:keyed_queue_task_act", args=[row.pk, "retry"])).content.decode()
    assert "runs again first, as itself" in retry
    row.refresh_from_db()
    assert (row.status, row.attempts) == ("failed", 1) and "the ledger refused it" in row.error


@pytest.mark.parametrize("kept", [b"1|{not json", b"1|" + b'{"status": [], "fields": []}', b"no bar", b"1|\x00" * 1000])
def test_a_kept_end_that_is_not_a_record_leaves_the_task_s_page_as_its_row_says(gate_redis, broker, admin_client, kept):
    """The gate's Redis may hold anything where a run's end is kept: the page reads the row as it is."""
    task = submitted("k", 1)
    get_gate().client.hset(KeyNames("k").outcomes, outcome_field(task.task_id, task.ticket), kept)
    assert admin_client.get(page_of(task)).status_code == 200
    assert KeyedTask.objects.get(pk=task.pk).status == task.status
