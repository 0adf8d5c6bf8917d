"""The live keys page shows what Redis holds first: the keys with work in the gate, whatever the rows say; rows
that say unfinished for keys that hold nothing in Redis are listed apart; the Key box finds a key by its words.
Real Redis, SQLite or PostgreSQL; the page's work stays the same however many rows and keys there are."""

from __future__ import annotations

import re
import time
import uuid
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.cluster import RedisCluster

from django_keyed_queue.gate import Start
from django_keyed_queue.gate.keys import KeyNames
from django_keyed_queue.messaging.message import ENQUEUED_HEADER, TaskMessage
from django_keyed_queue.ops.console import live, unheld
from django_keyed_queue.ops.console.live import live_keys
from django_keyed_queue.process.state import current, get_gate
from django_keyed_queue.records.models import KeyedTask
from django_keyed_queue.records.statuses import ACTIVE_STATUSES
from django_keyed_queue.testing import write_submission_rows
from testproject.demo.tasks import step
from tests.django.queues import QUEUE
from tests.gate_redis import DEADLINES, set_index_scores

pytestmark = pytest.mark.django_db
PAGE = "admin:keyed_queue_keys"
STEP = "testproject.demo.tasks.step"


def running_with_two_waiting(key: str) -> list[KeyedTask]:
    """``key``: its first task running (its worker started it), two behind it."""
    results = [step.apply_async((key, n), queue=QUEUE) for n in (1, 2, 3)]
    write_submission_rows()
    assert get_gate().start(Start(key, 1, 1)).ok
    KeyedTask.objects.filter(task_id=results[0].id).update(status="running", started_at=timezone.now())
    return [KeyedTask.objects.get(task_id=r.id) for r in results]


def unheld_rows(count: int, *, prefix: str = "bench", hours_ago: float = 2) -> list[str]:
    """``count`` keys with one row each that says waiting, older than any live task, and nothing in Redis
    (as a bench leaves them, or a Redis that lost them); the first is the oldest."""
    long_ago = timezone.now() - timedelta(hours=hours_ago)
    keys = [f"{prefix}:{n}" for n in range(count)]
    KeyedTask.objects.bulk_create(
        KeyedTask(task_id=str(uuid.uuid4()), task_name=STEP, key=key, ticket=1, status="waiting",
                  enqueued_at=long_ago + timedelta(seconds=n))
        for n, key in enumerate(keys)
    )  # fmt: skip
    return keys


def shown(page: str, table: str = "live-keys") -> list[str]:
    """The keys a table of the page lists, in order."""
    body = page.split(f'id="{table}"', 1)[1].split("</table>", 1)[0] if f'id="{table}"' in page else ""
    return re.findall(r'<tr class="[^"]*" data-key="([^"]*)"', body)


def test_a_key_with_work_in_redis_comes_first_whatever_the_rows_of_other_keys_say(gate_redis, broker, as_user):
    stale = unheld_rows(150)
    running_with_two_waiting("ledger:1001")

    page = as_user("olga").get(reverse(PAGE)).content.decode()

    assert shown(page) == ["ledger:1001"], "only the key Redis holds work for is live"
    row = page.split('data-key="ledger:1001"', 1)[1].split("</tr>", 1)[0]
    assert "running" in row and '<td class="depth">' in row and ">2</a>" in row
    assert 'class="oldest-wait">—' not in row, "two tasks wait: the oldest one's wait is shown"
    apart = shown(page, "unheld-keys")
    assert apart == stale[:20], "the oldest first, bounded"
    assert "manage.py keyed_queue_rebuild --dry-run" in page and "keyed_queue_purge</code> deletes expired" in page
    assert "There may be more such keys." in page


def test_a_stuck_key_shows_how_long_its_tasks_have_waited(gate_redis, broker, as_user, settings):
    settings.KEYED_QUEUE_LEASE_SECONDS = 0.05
    settings.KEYED_QUEUE_REAP_INTERVAL_SECONDS = 0.01
    current().reset_gate()
    try:
        unheld_rows(120)
        tasks = running_with_two_waiting("stalled")
        KeyedTask.objects.filter(pk=tasks[1].pk).update(enqueued_at=timezone.now() - timedelta(minutes=5))
        time.sleep(0.1)  # its lease ran out, and no reaper runs
        [state] = live_keys().states
    finally:
        current().reset_gate()
    assert (state.key, state.stuck, state.depth) == ("stalled", True, 2)
    assert 299 < state.waited_seconds < 330, "its oldest waiting task's, from its row"


def test_a_key_waiting_longest_is_found_through_its_rows_past_the_keys_read_from_the_index(gate_redis, broker):
    for n in range(20):
        running_with_two_waiting(f"busy:{n}")
    tasks = running_with_two_waiting("waits-longest")
    KeyedTask.objects.filter(pk=tasks[1].pk).update(enqueued_at=timezone.now() - timedelta(hours=1))
    set_index_scores(gate_redis, DEADLINES, {"waits-longest": 10**14})  # the last the reaper looks at

    page = live_keys(read=5, limit=3)

    assert page.states[0].key == "waits-longest" and page.unread == 16 and page.more > 0


def test_the_oldest_wait_is_the_gate_s_while_it_keeps_the_submission(gate_redis, broker):
    running_with_two_waiting("k")
    waiting = KeyedTask.objects.get(key="k", ticket=2)
    KeyedTask.objects.filter(pk=waiting.pk).update(enqueued_at=timezone.now() - timedelta(hours=1))
    assert 3599 < live_keys(search="k").states[0].waited_seconds < 3700, "from its row"

    later = step.apply_async(("j", 1), queue=QUEUE)  # not written: the gate keeps its record and its time
    step.apply_async(("j", 2), queue=QUEUE)
    [state] = live_keys(search="j").states
    assert state.waited_seconds < 5 and not KeyedTask.objects.filter(task_id=later.id, key="k").exists()

    step.apply_async(("x", 1), queue=QUEUE)
    kept = get_gate().client.hget(KeyNames("x").unwritten, 1)
    get_gate().client.hset(KeyNames("x").unwritten, 1, kept.replace(kept.split(b"|")[1], b"9" * 400, 1))
    assert live_keys(search="x").states[0].key == "x", "a time no datetime holds is passed by"


def test_without_a_row_the_oldest_wait_is_the_stored_message_s_stamp_else_unknown(gate_redis, broker, as_user):
    running_with_two_waiting("k")
    KeyedTask.objects.filter(key="k", ticket=2).delete()
    [state] = live_keys(search="k").states
    assert state.oldest_wait is not None and state.waited_seconds < 30, "its producer stamped its message"

    stamp = TaskMessage.decode(get_gate().client.hget(KeyNames("k").messages, 2), ["json"])
    stamp.options["headers"][ENQUEUED_HEADER] = 1e300  # a time no datetime holds: anyone may write Redis
    get_gate().client.hset(KeyNames("k").messages, 2, stamp.encode("json"))
    assert live_keys(search="k").states[0].oldest_wait is None

    get_gate().client.hset(KeyNames("k").messages, 2, b"not a message")
    page = as_user("olga").get(reverse(PAGE), {"key": "k"}).content.decode()
    assert '<td class="oldest-wait"><span title="Neither Redis nor the records say' in page
    assert ">unknown</span>" in page


def test_rows_that_say_unfinished_for_keys_redis_holds_nothing_of_are_apart(gate_redis, broker, as_user):
    lost = unheld_rows(3, prefix="lost")
    finished = running_with_two_waiting("done")
    KeyedTask.objects.filter(key="done").update(status="succeeded")
    get_gate().client.delete(*KeyNames("done").all())  # its tasks ran: Redis keeps nothing of it

    page = as_user("olga").get(reverse(PAGE)).content.decode()

    assert shown(page) == [] and "No key holds a task or has tasks waiting in Redis" in page
    assert shown(page, "unheld-keys") == lost
    assert f'href="{reverse("admin:keyed_queue_keyedtask_changelist")}?key=lost%3A0"' in page
    assert "1 (1 waiting)" in page and finished[0].key not in shown(page, "unheld-keys")


def test_a_page_that_checked_part_of_the_index_says_so_rather_than_that_no_key_has_work(
    gate_redis, broker, as_user, monkeypatch
):
    monkeypatch.setattr(live, "KEYS_READ", 5)
    set_index_scores(gate_redis, DEADLINES, {f"drained:{n}": 10**14 + n for n in range(10)})  # none overdue

    page = as_user("olga").get(reverse(PAGE)).content.decode()

    # On a cluster, the earliest of each shard: fewer than 5 where some shards hold none of the 10.
    checked = re.search(r"None of the (\d+) keys checked holds a task or has tasks waiting in Redis\.", page)
    assert checked and 1 < int(checked[1]) <= 5
    assert f"Redis indexes 10 keys that had a holder lately; the page checked the {checked[1]}" in page
    assert "No key holds" not in page


@pytest.mark.parametrize(
    ("typed", "found"),
    [
        ("1001", ["1001/refund", "ledger:1001"]),
        ("ledger 1001", ["ledger:1001"]),
        ("ledger:1001", ["ledger:1001"]),
        ("ledger", ["ledger:1001", "ledger:21001"]),
        ("a b", ["a b"]),
        ("led", []),
    ],
)
def test_the_key_box_finds_keys_by_their_words(gate_redis, broker, as_user, typed, found):
    for key in ("ledger:1001", "ledger:21001", "1001/refund", "a b", "other"):
        step.apply_async((key, 1), queue=QUEUE)
    get_gate().pause("paused:9")

    page = as_user("olga").get(reverse(PAGE), {"key": typed}).content.decode()

    assert sorted(shown(page)) == found
    assert ("No live key matches" in page) == (not found)


def test_a_key_box_that_matches_nothing_says_so_and_shows_the_rows_apart(gate_redis, broker, as_user):
    running_with_two_waiting("ledger:21001")
    unheld_rows(2, prefix="old:1001")

    page = as_user("olga").get(reverse(PAGE), {"key": "1001"}).content.decode()

    assert shown(page) == [] and "No live key matches “1001”." in page
    assert "No key holds" not in page, "other keys do have work"
    assert shown(page, "unheld-keys") == ["old:1001:0", "old:1001:1"]


#: Commands a client sends for itself (a new connection's set-up, the count's own INFO), not the page.
CONNECTIONS_OWN = ("cmdstat_client", "cmdstat_select", "cmdstat_hello", "cmdstat_info", "cmdstat_ping")


def commands_run(client) -> int:
    """How many commands Redis ran so far for its callers (over every master of a cluster)."""
    if isinstance(client, RedisCluster):
        stats = list(client.info("commandstats", target_nodes=RedisCluster.PRIMARIES).values())
    else:
        stats = [client.info("commandstats")]
    return sum(v["calls"] for s in stats for k, v in s.items() if not k.startswith(CONNECTIONS_OWN))


def page_load_cost(gate_redis, read: int) -> tuple[int, int]:
    """The Redis commands and the queries of one ``live_keys(read=read)``. What this process counted, and the
    records it buffered (an earlier test's), are written first: the totals' and the recorder's own threads
    would write them within a second, inside the measured load on a slow machine (two commands more, once)."""
    current().totals.flush()
    current().recorder.flush()
    before = commands_run(gate_redis)
    with CaptureQueriesContext(connection) as queries:
        live_keys(read=read)
    return commands_run(gate_redis) - before, len(queries)


def test_a_page_load_costs_the_same_however_many_keys_and_rows(gate_redis, broker):
    running_with_two_waiting("live")
    unheld_rows(300)
    set_index_scores(gate_redis, DEADLINES, {f"drained:{n}": n for n in range(200)})
    small = page_load_cost(gate_redis, read=50)
    unheld_rows(300, prefix="more")
    set_index_scores(gate_redis, DEADLINES, {f"drained:{n}": n for n in range(200, 2000)})
    assert page_load_cost(gate_redis, read=50) == small
    commands, queries = small
    # Six commands a key read (the 50 of the index, the 100 overdue), one a key of the oldest unfinished rows.
    assert commands <= (50 + 100) * 6 + len(ACTIVE_STATUSES) * unheld.ROWS_READ + 60 and queries <= 12, small


# -- the Key box, fuzzed: any text, NUL, huge, unicode, glob's own characters ---------------------------------

LIVE_KEYS = ("ledger:1001", "ledger:21001", "ü-1001", "a*b[1]")
#: The separators the page's help names, written here apart from the code.
SEPARATORS = re.compile(r"[ :/\-_.|#,;=+@]+")


def words(text: str) -> list[str]:
    return [w for w in SEPARATORS.split(text) if w]


def expected(typed: str, key: str) -> bool:
    """The rule the page's help states: the key whole, or its words holding the typed words in a row."""
    want, have = words(typed), words(key)
    return key == typed or (bool(want) and any(have[i : i + len(want)] == want for i in range(len(have))))


TYPED = st.one_of(
    st.text(st.characters(codec="utf-8"), max_size=30),
    st.text(alphabet="1001ledgerü:* [\\]?\x00", max_size=12),
    st.sampled_from([*LIVE_KEYS, "1001", "ledger", "ü", "*", "[1]", "\x00", "ledger\x001001", "k" * 10_000, "é" * 201]),
)


@pytest.fixture
def live_site(gate_redis, broker):
    for key in LIVE_KEYS:
        step.apply_async((key, 1), queue=QUEUE)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(typed=TYPED)
def test_the_key_box_answers_any_text_with_the_keys_it_names(live_site, admin_client, typed):
    with transaction.atomic():
        response = admin_client.get(reverse(PAGE), {"key": typed})
    if "\x00" in typed:
        assert response.status_code == 400 and "contains a NUL character" in response.content.decode()
        return
    assert response.status_code == 200
    page = response.content.decode()
    if not typed:
        assert sorted(shown(page)) == sorted(LIVE_KEYS)
        return
    want = sorted(k for k in LIVE_KEYS if expected(typed, k))
    assert sorted(shown(page)) == want, typed[:80]
    assert ("No live key matches" in page) == (not want)
