"""The keyed task list: cursor pages over every row, with filters and search, and nothing counted."""

from __future__ import annotations

import html
import re
from datetime import timedelta

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils.timezone import localtime, now

from django_keyed_queue.keyed_task.task import KeyedSerialTask
from django_keyed_queue.records.models import KeyedTask
from testproject.celery import app
from tests.admin_rows import TASK_NAMES, is_task_name_seek, seed_tasks

from .changelist_pages import open_page, url, walk


def keyed_tasks() -> list[str]:
    """The registered keyed tasks (once the list imported the project's task modules)."""
    return [name for name, task in app.tasks.items() if isinstance(task, KeyedSerialTask)]


pytestmark = pytest.mark.django_db
PER_PAGE = 10


@pytest.fixture
def admin_client(client, monkeypatch):
    monkeypatch.setattr(admin.site._registry[KeyedTask], "list_per_page", PER_PAGE)
    client.force_login(get_user_model().objects.create_superuser("root", "root@example.com", "pw"))
    return client


@pytest.mark.parametrize("count", [PER_PAGE * 3, 47])
def test_pages_cover_every_row_once_forward_and_back(admin_client, count):
    rows = seed_tasks(count)
    expected = [r.pk for r in reversed(rows)]
    forward, backward = walk(admin_client, "")
    assert [pk for page in forward for pk in page] == expected
    assert all(len(page) == PER_PAGE for page in forward[:-1])
    assert backward == forward  # going back shows the same pages


@pytest.mark.parametrize(
    ("query", "keep"),
    [
        ("?status__exact=failed", lambda r: r.status == "failed"),
        (f"?task_name={TASK_NAMES[1]}", lambda r: r.task_name == TASK_NAMES[1]),
        ("?q=account:3", lambda r: r.key == "account:3"),
        (f"?q=account:3&task_name={TASK_NAMES[0]}", lambda r: r.key == "account:3" and r.task_name == TASK_NAMES[0]),
        ("?q=account:5&status__exact=succeeded", lambda r: r.key == "account:5" and r.status == "succeeded"),
    ],
)
def test_filters_and_search_combine_with_the_cursor(admin_client, query, keep):
    rows = seed_tasks(500)
    expected = [r.pk for r in reversed(rows) if keep(r)]
    assert len(expected) > 2 * PER_PAGE  # several pages of them
    forward, backward = walk(admin_client, query)
    assert [pk for page in forward for pk in page] == expected
    assert backward == forward


def test_search_by_task_id_finds_the_one_task(admin_client):
    rows = seed_tasks(30)
    ids, links, _ = open_page(admin_client, f"?q={rows[12].task_id}")
    assert ids == [rows[12].pk] and links == {}


def test_search_of_a_whole_key_reads_its_index(admin_client):
    """The other kinds of search (a key's first words, a short id, a task name) are in test_admin_search.py."""
    seed_tasks(40)
    spaced = KeyedTask.objects.create(task_id="t-spaced", task_name=TASK_NAMES[0], key="file /a b", enqueued_at=now())
    assert open_page(admin_client, "?q=file%20/a%20b")[0] == [spaced.pk]  # one value, not two words
    assert open_page(admin_client, "?q=ACCOUNT:3")[0] == []  # keys are case-sensitive
    with CaptureQueriesContext(connection) as captured:
        ids, _, _ = open_page(admin_client, "?q=%20account:3%20")
    assert len(ids) == 6
    page = [q["sql"] for q in captured.captured_queries if f"LIMIT {PER_PAGE + 1}" in q["sql"]]
    assert len(page) == 1 and "\"key\" = 'account:3'" in page[0], page
    # Case-sensitive, and a LIKE only of a start (PostgreSQL's pattern index reads it; SQLite's range does).
    assert not [q for q in captured.captured_queries if "UPPER" in q["sql"] or "LIKE '%" in q["sql"]]


def test_search_finds_a_key_that_begins_with_a_space(admin_client):
    seed_tasks(10)
    leading = KeyedTask.objects.create(task_id="t-lead", task_name=TASK_NAMES[0], key=" account:3", enqueued_at=now())
    account_3 = list(KeyedTask.objects.filter(key="account:3").order_by("-id").values_list("pk", flat=True))
    assert open_page(admin_client, "?q=%20account:3")[0] == [leading.pk, *account_3], "as typed, and trimmed"
    assert leading.pk not in open_page(admin_client, "?q=account:3")[0]


def test_a_page_is_one_select_of_a_page_and_a_row_with_nothing_counted(admin_client):
    seed_tasks(PER_PAGE * 3)
    _, links, _ = open_page(admin_client)  # the session and the user are loaded once
    for query in ("", links["older"], "?status__exact=failed&q=account:3", "?_facets=1", "?o=3", "?all="):
        with CaptureQueriesContext(connection) as captured:
            ids, _, _ = open_page(admin_client, query)
        sql = [q["sql"] for q in captured.captured_queries]
        assert not [s for s in sql if "COUNT(" in s.upper()], (query, sql)
        pages = [s for s in sql if "keyed_queue_keyedtask" in s and f"LIMIT {PER_PAGE + 1}" in s]
        # The task-name filter seeks each name the rows have, and once more to find no other.
        names = [s for s in sql if is_task_name_seek(s)]
        probes = [s for s in sql if "keyed_queue_keyedtask" in s and s not in pages + names]
        assert len(pages) == 1, (query, sql)
        assert len(names) == len(set(KeyedTask.objects.values_list("task_name", flat=True))) + 1, (query, sql)
        # A search first turns its text into a few index lookups (test_admin_search.py has their plans).
        assert (0 < len(probes) <= 6) if "q=" in query else not probes, (query, sql)
        assert len(sql) == 3 + len(names) + len(probes), (query, sql)  # the page, the session, the user
        assert ids, query


def test_cursor_and_sort_parameters_are_not_taken_for_field_lookups(admin_client):
    rows = seed_tasks(25)
    newest = [r.pk for r in reversed(rows)]
    ids, links, response = open_page(admin_client, f"?cursor={newest[4]}&status__exact=succeeded&o=2")
    assert ids and all(pk < newest[4] for pk in ids)
    assert ids == sorted(ids, reverse=True)  # the keyset order, not the column asked for
    assert "cursor=" not in links["newest"] and "status__exact=succeeded" in links["newest"]
    # Changing a filter starts again at the newest rows: the filter links drop the cursor.
    filter_links = re.findall(r'href="(\?[^"]*)"', html.unescape(str(response.content, "utf-8")))
    assert "?status__exact=failed" in filter_links
    changes = [link for link in filter_links if "failed" in link or "task_name=" in link]
    assert changes and not [link for link in changes if "cursor=" in link]
    assert not [link for link in filter_links if "o=" in link]


@pytest.mark.parametrize(
    "query", ["?cursor=abc", "?cursor=-5", "?cursor=99999999999999999999999", "?before=x", "?cursor=3&before=9"]
)
def test_a_bad_cursor_shows_the_newest_page_with_a_warning(admin_client, query):
    rows = seed_tasks(PER_PAGE + 5)
    ids, links, response = open_page(admin_client, query)
    assert ids == [r.pk for r in reversed(rows)][:PER_PAGE]
    assert "older" in links and "newer" not in links
    assert "Ignored a bad page cursor" in str(response.content, "utf-8")


def test_past_either_end_the_links_lead_back_to_the_rows(admin_client):
    rows = seed_tasks(PER_PAGE + 5)
    newest = [r.pk for r in reversed(rows)]
    ids, links, response = open_page(admin_client, "?cursor=0")
    assert ids == [] and "no older tasks" in str(response.content, "utf-8")
    assert open_page(admin_client, links["newer"])[0] == newest[-PER_PAGE:]
    ids, links, _ = open_page(admin_client, f"?before={newest[0] + 100}")  # nothing newer: the first page
    assert ids == newest[:PER_PAGE] and "newer" not in links
    ids, links, _ = open_page(admin_client, f"?cursor={newest[0] + 100}")
    assert ids == newest[:PER_PAGE] and "newer" in links


@pytest.mark.parametrize(
    "query", ["?message__contains=secret", "?message__regex=s.cret", "?arguments__icontains=secret", "?worker=w1"]
)
def test_lookups_outside_the_allow_list_are_refused(admin_client, query):
    assert admin_client.get(url(query)).status_code == 400


def test_the_list_shows_short_ids_seconds_and_durations(admin_client):
    at = now().replace(microsecond=250_000)
    task = KeyedTask.objects.create(
        task_id="0123456789abcdef-full-id",
        task_name=TASK_NAMES[0],
        key="account:1",
        status="succeeded",
        enqueued_at=at,
        started_at=at + timedelta(seconds=2.5),
        finished_at=at + timedelta(milliseconds=2512),
    )
    page = admin_client.get(reverse("admin:keyed_queue_keyedtask_changelist")).content.decode()
    assert '<span title="0123456789abcdef-full-id">01234567</span>' in page
    day, time_of_day = localtime(at).strftime("%Y-%m-%d"), localtime(at).strftime("%H:%M:%S")
    assert f'{day}</span> <span class="kq-unbroken">{time_of_day}' in page, "a moment, wrapping at its space"
    assert "2.5 s" in page and "12 ms" in page, "waited for the key, then ran"
    detail = admin_client.get(reverse("admin:keyed_queue_keyedtask_change", args=[task.pk])).content.decode()
    assert "0123456789abcdef-full-id" in detail
    assert localtime(at).strftime("%Y-%m-%d %H:%M:%S") + ".250" in detail, "milliseconds on the task's page"


def test_the_task_name_filter_lists_the_names_that_have_records(admin_client):
    KeyedTask.objects.create(task_id="t1", task_name="testproject.demo.tasks.step", key="k", enqueued_at=now())
    page = admin_client.get(reverse("admin:keyed_queue_keyedtask_changelist")).content.decode()
    assert "?task_name=testproject.demo.tasks.step" in html.unescape(page)
    assert "?task_name=testproject.demo.tasks.write_file" not in html.unescape(page), "registered, never submitted"


# -- a search that finds one task, or none --


def filter_links(response) -> list[str]:
    """The sidebar's links (the filters' choices), each a query string."""
    sidebar = str(response.content, "utf-8").partition('id="changelist-filter"')[2]
    return [html.unescape(link) for link in re.findall(r'href="(\?[^"]*)"', sidebar)]


def test_a_search_from_the_box_that_finds_one_task_opens_its_page_and_close_leads_back(admin_client):
    task = seed_tasks(30)[12]
    list_page = admin_client.get(url())
    assert re.search(
        r'<input type="hidden" name="_searched" value="1" form="changelist-search">', list_page.content.decode()
    )

    opened = admin_client.get(url(f"?q={task.task_id[:8]}&_searched=1"), follow=True)
    assert opened.redirect_chain[0][1] == 302
    assert opened.request["PATH_INFO"] == reverse("admin:keyed_queue_keyedtask_change", args=[task.pk])
    page = opened.content.decode()
    assert task.task_id in page and f"The only task that “{task.task_id[:8]}” finds." in page
    close = html.unescape(re.search(r'<a (?:role="button" )?href="([^"]*)" class="closelink"', page).group(1))
    assert close == url(f"?q={task.task_id[:8]}"), "the list of that search, which opens no page"
    ids, links, _ = open_page(admin_client, close.removeprefix(url()))
    assert ids == [task.pk] and links == {}


@pytest.mark.parametrize(
    "query",
    [
        "?q=account:3&_searched=1",  # six tasks
        "?q={id}",  # one task, from a link that keeps the search (a filter's, the task page's "Close")
        "?q={id}&_searched=1&cursor={after}",  # a page of the search
        "?q=no-such-key&_searched=1",
    ],
)
def test_a_search_opens_no_page_unless_it_came_from_the_box_and_found_one_task(admin_client, query):
    rows = seed_tasks(30)
    response = admin_client.get(url(query.format(id=rows[12].task_id, after=rows[12].pk + 1)))
    assert response.status_code == 200
    kept = filter_links(response) + [response.context["cl"].newest_url]
    assert kept and not [link for link in kept if "_searched" in link], "the links never open a page"


def test_the_filters_links_drop_a_search_that_found_nothing_and_keep_one_that_found(admin_client):
    seed_tasks(30)
    nothing = admin_client.get(url("?q=no-such-key&status__exact=failed"))
    links = filter_links(nothing)
    assert links and not [link for link in links if "q=" in link]
    assert [link for link in links if "task_name=" in link and "status__exact=failed" in link], "the filter is kept"
    assert 'value="no-such-key"' in nothing.content.decode(), "the box still shows what was typed"
    refused = filter_links(admin_client.get(url("?q=account%003")))  # NUL: Django's search form refuses it
    assert refused and not [link for link in refused if "q=" in link]
    found = filter_links(admin_client.get(url("?q=account:3&status__exact=failed")))
    assert found and all("q=account%3A3" in link for link in found)


def test_the_list_shows_a_submission_whose_row_the_workers_did_not_write_yet(admin_client, gate_redis):
    """The workers write a submission's row only past the record delay: the list writes it first."""
    from django_keyed_queue.process.state import get_gate
    from testproject.demo.tasks import step
    from tests.django.queues import QUEUE

    result = step.apply_async(("young", 1), queue=QUEUE)
    assert not KeyedTask.objects.filter(task_id=result.id).exists()

    page = admin_client.get(url()).content.decode()

    assert KeyedTask.objects.get(task_id=result.id).status == "dispatched"
    assert result.id[:8] in page
    assert get_gate().unwritten(["young"]).records == [], "written once: the workers will not write it again"


def test_the_task_name_filter_offers_the_names_the_records_have_one_seek_each(admin_client):
    """A task no longer registered (its module gone, its rows left) is listed too; each name costs one query
    through the (task_name, -id) index, not a DISTINCT over every row."""
    for n, name in enumerate(("shop.tasks.recalc_balance", "shop.tasks.charge", "shop.tasks.recalc_balance")):
        KeyedTask.objects.create(task_id=f"t-{n}", task_name=name, key="k", ticket=n + 1, enqueued_at=now())
    with CaptureQueriesContext(connection) as captured:
        page = admin_client.get("/admin/keyed_queue/keyedtask/").content.decode()
    assert "?task_name=shop.tasks.recalc_balance" in page and "?task_name=shop.tasks.charge" in page
    seeks = [q["sql"] for q in captured.captured_queries if is_task_name_seek(q["sql"])]
    assert len(seeks) == 3, "two names, and the seek that finds no third"
    assert not any("DISTINCT" in q["sql"] for q in captured.captured_queries)


def test_a_retried_or_superseded_original_is_marked_in_the_list(admin_client):
    for n, marks in enumerate(({"retried_as": "t-again"}, {"superseded_by": "t-newer"}, {})):
        KeyedTask.objects.create(
            task_id=f"t-{n}",
            task_name=TASK_NAMES[0],
            key="k",
            ticket=n + 1,
            enqueued_at=now(),
            status="failed",
            **marks,
        )
    page = admin_client.get("/admin/keyed_queue/keyedtask/").content.decode()
    statuses = re.findall(r'<td class="field-status_said">(.*?)</td>', page)
    assert statuses == ["failed", "failed, superseded", 'failed, <a href="?q=t-again" title="t-again">retried</a>']
