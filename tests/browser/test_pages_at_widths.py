"""Each admin page at 1280 px and 1920 px wide: nothing runs under anything, nothing is pushed off-screen.

Every page is saved as ``screenshots/<page>-<width>.png`` in the test artifacts. With
``KEYED_QUEUE_DOCS_SCREENSHOTS=1`` the 1280-px pictures of the task list, a task's page and the
live keys page are also written to ``docs/screenshots/`` (see docs/admin.md); a normal run
writes nothing under docs/.
"""

from __future__ import annotations

import os
import time
import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from django_keyed_queue.gate import Gate, Start
from django_keyed_queue.process.state import get_gate
from django_keyed_queue.records.models import IdempotencyKey, KeyedTask
from django_keyed_queue.records.statuses import Status
from django_keyed_queue.testing import write_submission_rows
from testproject.demo.tasks import step
from tests.browser.screenshots import DOCS_DIR, save_for_docs
from tests.browser.server import DATA_DIR, SERVER_REAP_INTERVAL_SECONDS

pytestmark = pytest.mark.django_db(transaction=True)
LIST = "/admin/keyed_queue/keyedtask/"
#: Viewport width -> height: a laptop and a desktop screen.
WIDTHS = {1280: 800, 1920: 1080}
#: Keys about 100 characters long, as a tenant/region/account scheme makes them.
LONG_KEYS = (
    "tenant:acme-industries/region:eu-west-1/account:4242/ledger:2026-11/invoices:reconcile-nightly-batch",
    "tenant:globex-corporation/region:us-east-2/account:90210/subscription:annual-renewal/payment-intent",
)
#: The pages docs/ shows, each down to the end of its content or to a height (the task list: its first screen).
DOCS_PAGES = {"task-list": 800, "task-page": None, "live-keys": None}
#: No worker reads this queue: what the server dispatches stays put.
QUEUE = "keyed-queue-browser-unconsumed"


# -- geometry ------------------------------------------------------------------------------------


def box(locator) -> dict:
    found = locator.bounding_box()
    assert found is not None, f"{locator} is not on the page"
    return found


def overlap(a: dict, b: dict) -> bool:
    across = a["x"] < b["x"] + b["width"] and b["x"] < a["x"] + a["width"]
    down = a["y"] < b["y"] + b["height"] and b["y"] < a["y"] + a["height"]
    return across and down


#: The boxes of an element's lines of text (its block box spans the whole width, text or not).
TEXT_BOXES = """element => {
    const range = document.createRange();
    range.selectNodeContents(element);
    return Array.from(range.getClientRects(), r => ({x: r.x, y: r.y, width: r.width, height: r.height}));
}"""


def assert_title_clear_of_the_buttons(page) -> None:
    """No line of the page's title (h1, and the subtitle h2 of Django 5 on) runs under an object-tools button."""
    # Django 6.1 puts them in a .titles box.
    titles = page.locator("#content > h1, #content > h2, #content .titles > h1, #content .titles > h2")
    assert titles.count() >= 1
    for title in titles.all():
        lines = title.evaluate(TEXT_BOXES)
        assert lines, f"{title} has no text"
        for button in page.locator("#content .object-tools li").all():
            for line in lines:
                assert not overlap(line, box(button)), (
                    f"at {page.viewport_size['width']} px the title {title.inner_text()[:60]!r}"
                    f" runs under the button {button.inner_text()!r}: {line} {box(button)}"
                )


#: Each box of the page that scrolls sideways, as "<tag>#id.class: scrollWidth > clientWidth" (Django's change list
#: scrolls its table inside ``.results``: a column behind that scrollbar is as hidden as one off-screen).
SCROLLED_BOXES = """() => Array.from(document.querySelectorAll("#content *")).filter(e => {
    const overflow = getComputedStyle(e).overflowX;
    return (overflow === "auto" || overflow === "scroll") && e.scrollWidth > e.clientWidth + 1;
}).map(e => `${e.tagName.toLowerCase()}#${e.id}.${e.className}: ${e.scrollWidth} > ${e.clientWidth}`)"""


#: A list's columns and their widths, for the message of a list wider than its box.
COLUMN_WIDTHS = """() => Array.from(document.querySelectorAll("#result_list thead th, #live-keys thead th"))
    .map(th => `${th.className}: ${Math.round(th.getBoundingClientRect().width)}`)"""


def assert_fits(page) -> None:
    """No horizontal scrollbar, of the window or of any box in it: nothing is wider than where it is shown."""
    scroll, client = page.evaluate("[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
    columns = page.evaluate(COLUMN_WIDTHS)
    assert scroll <= client, f"at {page.viewport_size['width']} px the page is {scroll} px wide: {columns}"
    columns = page.evaluate(COLUMN_WIDTHS)
    assert page.evaluate(SCROLLED_BOXES) == [], f"at {page.viewport_size['width']} px a box scrolls sideways: {columns}"


def assert_on_screen(page, locator) -> None:
    """Visible and inside the window's width (not pushed off to the right, nor scrolled out of its box)."""
    assert locator.is_visible()
    found, width = box(locator), page.evaluate("document.documentElement.clientWidth")
    assert 0 <= found["x"] and found["x"] + found["width"] <= width, f"{locator} at {found}, window {width} px"


def at_each_width(page, url: str):
    """Load ``url`` at each width in turn, yielding the width."""
    for width, height in WIDTHS.items():
        page.set_viewport_size({"width": width, "height": height})
        page.goto(url)
        yield width


def shoot(page, name: str) -> None:
    """``screenshots/<name>-<width>.png`` (the whole page); for the docs too when asked (see module doc)."""
    width = page.viewport_size["width"]
    directory = DATA_DIR / "screenshots"
    directory.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(directory / f"{name}-{width}.png"), full_page=True)
    if os.environ.get("KEYED_QUEUE_DOCS_SCREENSHOTS") == "1" and width == 1280 and name in DOCS_PAGES:
        save_for_docs(page, DOCS_DIR / f"{name}.png", DOCS_PAGES[name])


# -- what the pages show -------------------------------------------------------------------------


def seed_history() -> list[KeyedTask]:
    """About 60 records on 7 keys (2 of them long), each key's tasks one after another as the gate runs them:
    most succeeded, some failed or cancelled; on every other key the last one waits behind a running one."""
    now = timezone.now()
    keys = [*LONG_KEYS, *(f"account:{n}" for n in range(1, 6))]
    names = ("testproject.demo.tasks.sync_account", "testproject.demo.tasks.write_file", "testproject.demo.tasks.step")
    rows = []
    for k, key in enumerate(keys):
        count, free_at = 10 - k % 3, now - timedelta(minutes=20 - k)
        for n in range(count):
            enqueued = now - timedelta(minutes=20 - k, seconds=-97 * n - 13 * k)
            task = KeyedTask(
                task_id=str(uuid.uuid4()),
                task_name=names[(n + k) % 3],
                key=key,
                ticket=n + 1,
                attempts=1,
                enqueued_at=enqueued,
                arguments=f'["{key}", {n}]',
            )
            last = n == count - 1
            if k % 2 == 0 and last:
                task.status = Status.WAITING
                task.attempts = 0
            elif k % 2 == 0 and n == count - 2:
                task.status, task.started_at, task.worker = Status.RUNNING, max(free_at, enqueued), "celery@worker-1"
            elif n % 7 == 5:
                task.status, task.finished_at = Status.CANCELLED, enqueued + timedelta(seconds=4)
                task.attempts = 0
            else:
                task.started_at = max(free_at, enqueued) + timedelta(milliseconds=40 * n)
                task.finished_at = free_at = task.started_at + timedelta(seconds=0.3 + 11 * ((n * 7 + k) % 5))
                task.status = Status.FAILED if n % 4 == 3 else Status.SUCCEEDED
                task.worker = f"celery@worker-{1 + n % 2}"
                if task.status == Status.FAILED:
                    task.error = "Traceback (most recent call last):\n  ...\nConnectionError: the ledger timed out"
            rows.append(task)
    rows.sort(key=lambda task: task.enqueued_at)  # ids rise with submission, as in real use
    KeyedTask.objects.bulk_create(rows)
    return list(KeyedTask.objects.order_by("id"))


def submit(key: str, n: int) -> KeyedTask:
    result = step.apply_async((key, n), queue=QUEUE)
    write_submission_rows()  # as a worker does within KEYED_QUEUE_RECORD_FLUSH_SECONDS
    return KeyedTask.objects.get(task_id=result.id)


def run(task: KeyedTask, gate: Gate) -> None:
    """The task's worker starts it (the holder's lease begins) and records that."""
    assert gate.start(Start(task.key, task.ticket, 1, max_lost=3)).ok
    KeyedTask.objects.filter(pk=task.pk).update(
        status=Status.RUNNING, started_at=timezone.now(), attempts=1, worker="celery@worker-2"
    )


def seed_live_keys() -> dict[str, str]:
    """A running holder with tasks waiting, a holder stuck past its lease, a paused key with tasks waiting."""
    gate = get_gate()
    busy, stalled, paused = LONG_KEYS[0], LONG_KEYS[1], "account:7"
    first = submit(busy, 1)
    for n in (2, 3, 4):
        submit(busy, n)
    run(first, gate)
    stuck = submit(stalled, 1)
    submit(stalled, 2)
    short_lease = Gate(gate.client, lease_seconds=0.05)
    run(stuck, short_lease)
    gate.pause(paused)
    for n in (1, 2, 3):
        submit(paused, n)
    # Stuck once its deadline is two of the server's reaper periods behind: wait for that, by Redis's clock.
    deadline = time.monotonic() + 10
    while gate.inspect(stalled).holders[stuck.ticket].deadline_in > -(2 * SERVER_REAP_INTERVAL_SECONDS + 0.2):
        assert time.monotonic() < deadline, "the short lease never ran out"
        time.sleep(0.05)
    return {"running": busy, "stuck": stalled, "paused": paused}


# -- the pages -----------------------------------------------------------------------------------


def test_the_task_list(logged_in):
    page = logged_in
    rows = seed_history()
    for _ in at_each_width(page, LIST):
        shoot(page, "task-list")
        assert_fits(page)
        assert_title_clear_of_the_buttons(page)
        assert page.locator("#result_list tbody tr").count() == len(rows)
        assert_on_screen(page, page.locator("#result_list thead th").last)  # "ran": nothing pushed off
        assert_on_screen(page, page.locator("#changelist-filter"))
        newest = page.locator("#result_list tbody tr").first
        assert newest.locator("th.field-short_id span").get_attribute("title") == rows[-1].task_id
        long_key = page.locator("#result_list td.field-key", has_text=LONG_KEYS[0]).first
        assert_on_screen(page, long_key)


def test_a_task_page_with_a_long_key(logged_in):
    page = logged_in
    rows = seed_history()
    task = next(t for t in rows if t.key == LONG_KEYS[0] and t.status == Status.FAILED)
    for _ in at_each_width(page, f"{LIST}{task.pk}/change/"):
        shoot(page, "task-page")
        assert_title_clear_of_the_buttons(page)
        assert_fits(page)
        for name in ("All tasks of this key", "This key live", "History"):
            assert_on_screen(page, page.locator("#content .object-tools").get_by_role("link", name=name))
        assert task.task_id in page.locator(".field-task_id").inner_text()
        timeline = page.locator("#key-timeline svg")
        assert_on_screen(page, timeline)
        assert timeline.locator("g.timeline-current").get_attribute("data-task-id") == task.task_id


def test_the_live_keys_page(gate_redis, logged_in):
    page = logged_in
    keys = seed_live_keys()
    for _ in at_each_width(page, f"{LIST}keys/"):
        shoot(page, "live-keys")
        assert_fits(page)
        order = page.locator("#live-keys tr.live-key").evaluate_all("rows => rows.map(r => r.dataset.key)")
        assert order[2] == keys["running"] and set(order[:2]) == {keys["stuck"], keys["paused"]}
        row = {name: page.locator(f'#live-keys tr[data-key="{key}"]') for name, key in keys.items()}
        assert row["stuck"].locator(".errornote").inner_text() == "stuck"
        assert "overdue" in row["stuck"].locator(".lease").inner_text()
        assert row["paused"].locator("td.paused").inner_text().startswith("paused\nsince ")
        assert row["paused"].locator("td.depth").inner_text() == "3"
        assert "running" in row["running"].locator(".holder").inner_text()
        assert row["running"].locator("td.depth").inner_text() == "3"
        assert_on_screen(page, page.locator("#live-keys thead th").last)
        for name in keys:
            assert_on_screen(page, row[name].locator("td").first)
            assert_on_screen(page, row[name].locator("td.actions button").last)
        for button in page.locator("#live-keys td.actions a.button, #live-keys td.actions button").all():
            assert len(button.evaluate(TEXT_BOXES)) == 1, f"{button.inner_text()!r} wraps over its cell"


def test_the_idempotency_keys_list(logged_in):
    page = logged_in
    now = timezone.now()
    IdempotencyKey.objects.bulk_create(
        IdempotencyKey(
            fingerprint=uuid.uuid4().hex + uuid.uuid4().hex,
            task_id=str(uuid.uuid4()),
            task_name="testproject.demo.tasks.sync_account",
            created_at=now - timedelta(minutes=n),
            expires_at=now + timedelta(hours=24) - timedelta(minutes=n),
        )
        for n in range(12)
    )
    for _ in at_each_width(page, "/admin/keyed_queue/idempotencykey/"):
        shoot(page, "idempotency-keys")
        assert_fits(page)
        assert_title_clear_of_the_buttons(page)
        assert page.locator("#result_list tbody tr").count() == 12
        assert_on_screen(page, page.locator("#result_list thead th").last)


def test_our_pages_breadcrumbs_are_styled_as_django_s_own(gate_redis, logged_in):
    """Each Django writes its admin's breadcrumbs its own way (a ``div`` before 6.0, an ``ol`` since), and styles
    only that: ours, in the same markup, wear the same bar as Django's own pages."""
    page = logged_in
    task = seed_history()[0]
    page.goto(LIST)
    bar = page.locator(".breadcrumbs").evaluate("e => [getComputedStyle(e).backgroundColor, e.tagName]")
    for ours in (f"{LIST}keys/", f"{LIST}{task.pk}/act/cancel/"):
        page.goto(ours)
        assert page.locator(".breadcrumbs").evaluate("e => [getComputedStyle(e).backgroundColor, e.tagName]") == bar
