"""An operator at the keyed task list, in a real browser: pages, filters, search, a task's page."""

from __future__ import annotations

import pytest

from tests.admin_rows import seed_tasks

pytestmark = pytest.mark.django_db(transaction=True)
LIST = "/admin/keyed_queue/keyedtask/"
ROWS = "#result_list tbody tr"


def shown_task_ids(page) -> list[str]:
    """The full task ids of the rows: each row shows 8 characters, the whole id on hover (its title)."""
    return page.locator(f"{ROWS} th.field-short_id a span").evaluate_all("spans => spans.map(s => s.title)")


def column(page, name: str) -> list[str]:
    return page.locator(f"{ROWS} td.field-{name}").all_inner_texts()


def follow(page, link) -> None:
    """Click a link (a selector or a locator) and wait for the page it leads to."""
    with page.expect_navigation():
        (page.locator(link) if isinstance(link, str) else link).click()


def test_paging_through_the_list_with_the_cursor_links(logged_in, screenshot):
    page = logged_in
    newest_first = [row.task_id for row in reversed(seed_tasks(250))]
    follow(page, page.get_by_role("link", name="Keyed tasks"))
    assert shown_task_ids(page) == newest_first[:100]
    assert page.locator("#cursor-newer").count() == 0  # nothing is newer than the first page
    screenshot("1-newest")

    follow(page, "#cursor-older")
    assert shown_task_ids(page) == newest_first[100:200]
    screenshot("2-older")
    follow(page, "#cursor-older")
    assert shown_task_ids(page) == newest_first[200:]
    assert page.locator("#cursor-older").count() == 0 and page.get_by_text("no older tasks").is_visible()
    screenshot("3-oldest")

    follow(page, "#cursor-newer")
    assert shown_task_ids(page) == newest_first[100:200]
    follow(page, "#cursor-newer")
    assert shown_task_ids(page) == newest_first[:100] and page.locator("#cursor-newer").count() == 0
    screenshot("4-back-to-newest")


def test_filtering_by_status_and_searching_a_key(logged_in, screenshot):
    page = logged_in
    rows = list(reversed(seed_tasks(250)))
    page.goto(LIST)
    follow(page, page.locator("#changelist-filter").get_by_role("link", name="failed", exact=True))
    failed = [r.task_id for r in rows if r.status == "failed"]
    assert shown_task_ids(page) == failed and set(column(page, "status_said")) == {"failed"}
    screenshot("1-failed")

    page.fill("#searchbar", "account:3")
    with page.expect_navigation():
        page.press("#searchbar", "Enter")
    both = [r.task_id for r in rows if r.status == "failed" and r.key == "account:3"]
    assert both and shown_task_ids(page) == both  # the search keeps the filter
    screenshot("2-failed-on-a-key")

    follow(page, page.locator("#changelist-filter").get_by_role("link", name="All").first)
    on_key = [r.task_id for r in rows if r.key == "account:3"]
    assert shown_task_ids(page) == on_key and set(column(page, "key")) == {"account:3"}
    screenshot("3-one-key")


def test_opening_a_task_from_the_list(logged_in, screenshot):
    page = logged_in
    task = seed_tasks(30)[-3]
    page.goto(f"{LIST}?q={task.task_id}")
    assert shown_task_ids(page) == [task.task_id]
    assert page.locator(f"{ROWS} th.field-short_id").inner_text() == task.task_id[:8]
    follow(page, page.get_by_role("link", name=task.task_id[:8]))
    assert f"/keyedtask/{task.pk}/change/" in page.url
    content = page.locator("#content").inner_text()
    assert task.task_id in content and task.key in content and task.task_name in content
    screenshot("1-task-page")


def search(page, term: str) -> None:
    page.fill("#searchbar", term)
    with page.expect_navigation():
        page.press("#searchbar", "Enter")


def test_searching_a_number_of_a_key_then_a_task_the_search_opens(logged_in, screenshot):
    page = logged_in
    rows = list(reversed(seed_tasks(250)))
    page.goto(LIST)
    search(page, "3")  # the number in account:3, as a customer's ticket has it
    on_key = [r.task_id for r in rows if r.key == "account:3"]
    assert shown_task_ids(page) == on_key and set(column(page, "key")) == {"account:3"}
    screenshot("1-a-number-of-a-key")

    task = rows[40]
    search(page, task.task_id[:8])  # one task: its page, not a list of one
    assert f"/keyedtask/{task.pk}/change/" in page.url
    assert page.get_by_text(f"The only task that “{task.task_id[:8]}” finds.").is_visible()
    screenshot("2-the-one-task-it-finds")
    follow(page, page.get_by_role("link", name="Close"))
    assert shown_task_ids(page) == [task.task_id] and page.input_value("#searchbar") == task.task_id[:8]
    screenshot("3-back-to-the-list-of-it")
