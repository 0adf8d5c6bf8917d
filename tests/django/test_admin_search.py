"""The task list's search box: a task id or its start, a key or its first words with any separator, a
key by any one word of it, a task name or its last parts; the rows of every kind a term matches (the
keys' first), read through index lookups, on the cursor pages; on SQLite and on PostgreSQL
(``KEYED_QUEUE_TESTS_DATABASE=postgresql``)."""

from __future__ import annotations

import html
import random
import re
import uuid
from datetime import timedelta
from urllib.parse import quote

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_keyed_queue.ops.console import changelist
from django_keyed_queue.ops.console import search as search_module
from django_keyed_queue.records.models import KeyedTask
from tests.admin_rows import is_task_name_seek, write_key_words

from .changelist_pages import open_page, walk

pytestmark = pytest.mark.django_db
PER_PAGE = 10
#: The separators as docs/admin.md lists them: in a term each stands for any of them.
SEPARATORS = " :/-_.|#,;=+@"

KEYS = (
    *("account:6", "account:60", "account/6", "account:6:invoice:9", "account", "accounts:1", "Account:6"),
    *("tenant:3", "user_42", "a%b", "axb", "a_b", "a:b", "a\\b", " lead:1", "file /a b", "café:1", "a:b:c"),
)
NAMES = (
    "shop.tasks.send_invoice",
    "billing.send_invoice",
    "shop.tasks.send_invoice_v2",
    "shop.tasks.charge",
    "send",
)
#: Task ids that are not random: one that is also a key's word, short ones, one that starts like a name.
ODD_TASK_IDS = ("send-0001", "abc", "abcd-0002", "ABCD-0003", "tenant:3", "6")


def seed(count: int = 120) -> list[KeyedTask]:
    """``count`` records, oldest first, cycling through ``KEYS`` and ``NAMES``; random (seeded) task
    ids, but for ``ODD_TASK_IDS`` on a few rows."""
    rnd = random.Random(7)
    start = timezone.now() - timedelta(seconds=count)
    rows = []
    for i in range(count):
        task_id = ODD_TASK_IDS[i // 17] if i % 17 == 5 and i // 17 < len(ODD_TASK_IDS) else None
        rows.append(
            KeyedTask(
                task_id=task_id or str(uuid.UUID(int=rnd.getrandbits(128), version=4)),
                task_name=NAMES[i % len(NAMES)],
                key=KEYS[i % len(KEYS)],
                ticket=i + 1,
                status="failed" if i % 4 == 1 else "succeeded",
                enqueued_at=start + timedelta(seconds=i),
            )
        )
    KeyedTask.objects.bulk_create(rows)
    write_key_words(KEYS)
    return list(KeyedTask.objects.order_by("id"))


# -- the rules, as docs/admin.md states them, written apart from the code --


#: How many of a term's separators stand for any separator; later ones stand for themselves.
FLEXIBLE_SEPARATORS = 6


def key_matches(term: str, key: str) -> bool:
    """The key equals the term or begins with it up to a separator, each of the first six separators typed
    standing for any."""
    n = len(term)
    if len(key) < n:
        return False
    flexible = [i for i, t in enumerate(term) if t in SEPARATORS][:FLEXIBLE_SEPARATORS]
    alike = all(
        t == k or (i in flexible and k in SEPARATORS) for i, (t, k) in enumerate(zip(term, key[:n], strict=True))
    )
    return alike and (len(key) == n or term[-1] in SEPARATORS or key[n] in SEPARATORS)


def a_later_word(term: str, key: str) -> bool:
    """A term of one word is one of the key's words after its first (text between separators)."""
    words = re.split("[" + re.escape(SEPARATORS) + "]", key)
    return not any(c in SEPARATORS for c in term) and term in words[1:]


def key_match(typed: str, row: KeyedTask) -> bool:
    term = typed.strip()
    return row.key == typed or key_matches(term, row.key) or a_later_word(term, row.key)


def matches(typed: str, row: KeyedTask) -> bool:
    term = typed.strip()
    if not term or "\x00" in typed:
        return True  # no search; Django's search form refuses NUL ("Null characters are not allowed.")
    return (
        row.task_id == term
        or (len(term) >= 4 and row.task_id.startswith(term))
        or key_match(typed, row)
        or row.task_name == term
        or row.task_name.endswith("." + term)
    )


def expected(rows: list[KeyedTask], typed: str, keep=lambda row: True) -> list[int]:
    """The ids a search of ``typed`` should list: those its key matches first, each part newest first."""
    found = [row for row in reversed(rows) if matches(typed, row) and keep(row)]
    by_key = [row.pk for row in found if typed.strip() and "\x00" not in typed and key_match(typed, row)]
    return by_key + [row.pk for row in found if row.pk not in by_key]


# -- the admin, driven through Django's test client --


@pytest.fixture
def admin_client(client, monkeypatch):
    monkeypatch.setattr(admin.site._registry[KeyedTask], "list_per_page", PER_PAGE)
    client.force_login(get_user_model().objects.create_superuser("root", "root@example.com", "pw"))
    return client


def search(client, typed: str) -> list[int]:
    """The ids of every page a search of ``typed`` lists, newest first."""
    return every_page(client, f"?q={quote(typed)}")[0]


def every_page(client, query: str) -> tuple[list[int], list[list[int]], list[list[int]]]:
    """The ids of every page going older from ``query``, the pages, and the pages back again by "Newer"."""
    forward, backward = walk(client, query)
    return [pk for page in forward for pk in page], forward, backward


def by_pk(rows: list[KeyedTask], ids: list[int]) -> list[KeyedTask]:
    found = {row.pk: row for row in rows}
    return [found[pk] for pk in ids]


@pytest.fixture
def rows(admin_client) -> list[KeyedTask]:
    return seed()


# -- each kind of search --


def test_a_task_id_whole_or_its_start_of_four_or_more(admin_client, rows):
    task = rows[40]
    for typed in (task.task_id, task.task_id[:8], task.task_id[:4], f"  {task.task_id[:8]}  "):
        shown = by_pk(rows, search(admin_client, typed))
        assert task in shown and all(r.task_id.startswith(typed.strip()) for r in shown), typed
    assert by_pk(rows, search(admin_client, "abc")) == [r for r in reversed(rows) if r.task_id == "abc"]
    assert [r.task_id for r in by_pk(rows, search(admin_client, "abcd"))] == ["abcd-0002"]  # not ABCD-0003
    assert task.pk not in search(admin_client, task.task_id[:3])  # 3 characters: not by its start


def test_a_key_with_any_separator_or_its_first_words(admin_client, rows):
    def keys(typed: str) -> set[str]:
        return {r.key for r in by_pk(rows, search(admin_client, typed))}

    assert keys("account 6") == keys("account:6") == {"account:6", "account/6", "account:6:invoice:9"}
    assert keys("account 6 invoice") == {"account:6:invoice:9"}
    family = {"account:6", "account:60", "account/6", "account:6:invoice:9"}
    assert keys("account") == keys(" account ") == family | {"account"}  # spaces around the term are dropped
    assert keys("account:") == keys("account/") == family  # a key that goes on after account
    assert "accounts:1" not in keys("account") and "Account:6" not in keys("account")
    assert keys("file  a b") == {"file /a b"}
    assert keys("file a b") == set()  # a separator typed stands for one of the key's, not two
    assert keys("café 1") == {"café:1"}
    assert keys("user 42") == {"user_42"}


def test_a_task_name_whole_or_its_last_dotted_parts(admin_client, rows):
    def names(typed: str) -> set[str]:  # of the rows found by name ("invoice" is also a word of a key)
        return {r.task_name for r in by_pk(rows, search(admin_client, typed)) if not key_match(typed, r)}

    assert names("send_invoice") == {"shop.tasks.send_invoice", "billing.send_invoice"}
    assert names("tasks.send_invoice") == names("shop.tasks.send_invoice") == {"shop.tasks.send_invoice"}
    assert names("invoice") == set() and names("shop") == set()  # a part, not a piece of one


def test_a_term_of_several_kinds_lists_the_rows_of_each(admin_client, rows):
    # "send" is a task name, the start of a task id (send-0001) and no key: rows of both kinds.
    shown = by_pk(rows, search(admin_client, "send"))
    assert {r.task_name for r in shown} >= {"send"} and "send-0001" in {r.task_id for r in shown}
    assert [r.pk for r in shown] == expected(rows, "send")
    # "tenant:3" is a key and a task id (of a row whose key is another): the key's tasks first.
    ids = search(admin_client, "tenant:3")
    assert ids == expected(rows, "tenant:3")
    assert [r.key for r in by_pk(rows, ids)][-1] == "account:60"  # the task whose id it is, last
    assert {r.key for r in by_pk(rows, ids)[:-1]} == {"tenant:3"}


def test_the_search_is_case_sensitive(admin_client, rows):
    assert {r.key for r in by_pk(rows, search(admin_client, "Account 6"))} == {"Account:6"}
    assert search(admin_client, "ACCOUNT") == []
    assert search(admin_client, "SEND_INVOICE") == []


def test_a_key_that_begins_with_a_space_is_found_as_typed(admin_client, rows):
    assert {r.key for r in by_pk(rows, search(admin_client, " lead:1"))} == {" lead:1"}
    assert search(admin_client, "lead:1") == []  # its first character is a space, not an l


@pytest.mark.parametrize(
    ("typed", "keys"),
    [
        ("a%b", {"a%b"}),  # a literal %: not axb
        ("%", set()),
        ("%00", set()),  # the text, not a NUL
        ("a_b", {"a_b", "a:b", "a:b:c"}),  # _ is a separator, never LIKE's one character
        ("a\\b", {"a\\b"}),
        ("\\", set()),
        ("x" * 10_000, set()),
        ("%" * 300, set()),
        ("é" * 201, set()),
        ("💥 account", set()),
    ],
)
def test_odd_text_is_taken_literally_and_never_fails(admin_client, rows, typed, keys):
    shown = by_pk(rows, search(admin_client, typed))
    assert {r.key for r in shown} == keys
    assert [r.pk for r in shown] == expected(rows, typed)


@pytest.mark.parametrize("typed", ["\x00", "account\x006"])
def test_a_term_with_nul_is_refused_by_djangos_search_form_and_the_list_is_whole(admin_client, rows, typed):
    ids, _, response = open_page(admin_client, f"?q={quote(typed)}")
    assert ids == [row.pk for row in reversed(rows)][:PER_PAGE]
    assert "Null characters are not allowed" in response.content.decode()


def test_the_search_box_says_what_it_takes(admin_client):
    page = admin_client.get(reverse("admin:keyed_queue_keyedtask_changelist")).content.decode()
    help_text = str(admin.site._registry[KeyedTask].search_help_text)
    assert help_text and html.escape(help_text) in page
    for part in ("task id", "4+", "key", "account 6", "1001", "task name", "send_invoice", "Case-sensitive", "opens"):
        assert part in help_text


# -- a key by any one of its words --

#: Keys whose words are numbers, as on a customer's ticket, and keys that only look alike.
WORD_KEYS = ("ledger:1001", "ledger:10010", "ledger:1001x", "tenant:5:ledger:1001", "1001", "1001:refund",
             "webhook:88", "webhook:880", "webhook-88/retry", "x88")  # fmt: skip


def seed_words(count: int, keys=WORD_KEYS, task_ids=lambda i: None) -> list[KeyedTask]:
    """``count`` records, oldest first, cycling through ``keys``, written as ``seed`` writes them."""
    start = timezone.now() - timedelta(days=1)
    rows = [
        KeyedTask(task_id=task_ids(i) or f"w-{i}", task_name=NAMES[3], key=keys[i % len(keys)], ticket=i + 1,
                  status="succeeded", enqueued_at=start + timedelta(seconds=i))
        for i in range(count)
    ]  # fmt: skip
    KeyedTask.objects.bulk_create(rows)
    write_key_words(keys)
    return list(KeyedTask.objects.order_by("id"))


def test_a_word_finds_the_keys_that_have_it_whole_anywhere(admin_client):
    rows = seed_words(30)

    def keys(typed: str) -> set[str]:
        return {r.key for r in by_pk(rows, search(admin_client, typed))}

    assert keys("1001") == {"ledger:1001", "tenant:5:ledger:1001", "1001", "1001:refund"}
    assert keys("88") == {"webhook:88", "webhook-88/retry"}  # not webhook:880, not x88
    assert keys("880") == {"webhook:880"} and keys("1001x") == {"ledger:1001x"}
    assert keys("5") == {"tenant:5:ledger:1001"} and keys("retry") == {"webhook-88/retry"}
    assert keys("ledger") == {"ledger:1001", "ledger:10010", "ledger:1001x", "tenant:5:ledger:1001"}
    assert keys("100") == keys("001") == keys("8") == set()  # a piece of a word is not a word
    assert keys("5:ledger") == set()  # several words are read from a key's start


def test_a_word_lists_its_keys_tasks_before_the_tasks_whose_ids_begin_with_it(admin_client):
    # The newest rows have task ids that begin with 1001: the key's older tasks still come first.
    rows = seed_words(40, keys=("ledger:1001", "ledger:2"), task_ids=lambda i: f"1001{i:04}-id" if i >= 30 else None)
    shown = by_pk(rows, search(admin_client, "1001"))
    on_key = [r for r in reversed(rows) if r.key == "ledger:1001"]
    by_id = [r for r in reversed(rows) if r.task_id.startswith("1001") and r.key != "ledger:1001"]
    assert shown == on_key + by_id and by_id[0].pk > on_key[0].pk  # the newest row of all, listed after
    page = open_page(admin_client, "?q=1001")[2].content.decode()
    assert "those of matching keys first" in page


@pytest.mark.parametrize("few_matches", [changelist.FEW_MATCHES, 0], ids=["ids-of-few-matches", "walk-of-many"])
@pytest.mark.parametrize("word_keys_max", [search_module.WORD_KEYS_MAX, 1], ids=["keys-read", "keys-walked"])
def test_pages_of_a_ranked_search_list_every_match_once_older_and_newer(
    admin_client, monkeypatch, few_matches, word_keys_max
):
    monkeypatch.setattr(changelist, "FEW_MATCHES", few_matches)
    monkeypatch.setattr(search_module, "WORD_KEYS_MAX", word_keys_max)
    seed_words(35, keys=("x:charge", "y/charge", "charges:1"))  # older than the task name's rows
    rows = seed(200)
    want = expected(rows, "charge")
    keyed = [pk for pk in want if by_pk(rows, [pk])[0].key in ("x:charge", "y/charge")]
    assert len(keyed) > 2 * PER_PAGE and len(want) - len(keyed) > 2 * PER_PAGE and want[: len(keyed)] == keyed
    ids, forward, backward = every_page(admin_client, "?q=charge")
    assert ids == want
    assert backward == forward


# -- pages and plans --


@pytest.mark.parametrize("few_matches", [changelist.FEW_MATCHES, 0], ids=["ids-of-few-matches", "walk-of-many"])
@pytest.mark.parametrize(
    ("query", "keep"),
    [
        ("account", lambda r: True),  # a key prefix
        ("send_invoice", lambda r: True),  # two task names
        ("account 6&status__exact=succeeded", lambda r: r.status == "succeeded"),
        ("tenant:3", lambda r: True),  # one key: read in order from its index
    ],
)
def test_pages_of_a_search_list_every_match_once_older_and_newer(admin_client, monkeypatch, few_matches, query, keep):
    monkeypatch.setattr(changelist, "FEW_MATCHES", few_matches)
    rows = seed(400)
    typed, _, more = query.partition("&")
    want = expected(rows, typed, keep)
    assert len(want) > 2 * PER_PAGE, "several pages"
    ids, forward, backward = every_page(admin_client, f"?q={quote(typed)}" + (f"&{more}" if more else ""))
    assert ids == want
    assert backward == forward  # "Newer" goes back through the same pages


def search_sql(client, typed: str) -> list[str]:
    """The statements a search of ``typed`` runs on the keyed tasks, but for the task name filter's."""
    with CaptureQueriesContext(connection) as captured:
        open_page(client, f"?q={quote(typed)}")
    statements = [q["sql"] for q in captured.captured_queries if "keyed_queue_keyedtask" in q["sql"]]
    return [s for s in statements if not is_task_name_seek(s)]


def plan(sql: str) -> str:
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SET LOCAL enable_seqscan = off")  # so that a Seq Scan shows only where no index serves
            cursor.execute("EXPLAIN " + sql)
            return "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute("EXPLAIN QUERY PLAN " + sql)
        return "\n".join(row[-1] for row in cursor.fetchall())


@pytest.mark.parametrize(
    "typed", ["account", "account 6", "refund", "send_invoice", "abcd", "nothing-at-all", "6", "invoice", "tenant:3"]
)
def test_a_search_looks_its_term_up_by_index_ranges_not_by_reading_the_table(admin_client, rows, typed):
    statements = search_sql(admin_client, typed)
    page = [s for s in statements if f"LIMIT {PER_PAGE + 1}" in s]
    lookups = [s for s in statements if s not in page]
    assert lookups
    for sql in lookups:
        shown = plan(sql)
        # SQLite: SCAN is a full read of a table or an index; SEARCH is a range of one.
        assert not re.search(r"SCAN (keyed_queue_keyedtask|U\d)", shown) and "Seq Scan" not in shown, (sql, shown)
        if connection.vendor == "sqlite":
            assert " LIKE " not in sql, sql  # SQLite's LIKE ignores case and no index serves it
    for sql in page:  # by the ids of few matches, or one key's or name's index in page order
        shown = plan(sql)
        assert "SCAN keyed_queue_keyedtask" not in shown and "Seq Scan" not in shown, (sql, shown)


def test_a_term_s_first_six_separators_stand_for_any_and_its_cost_is_bounded_however_long(admin_client):
    many_words = ["".join(f"x{sep}" for sep in (SEPARATORS * 20)[n : n + 99]) + "x" for n in range(32)]
    keys = ["a:b:c:d:e:f:g h", "a:b:c:d:e:f:g:h", *many_words]
    KeyedTask.objects.bulk_create(
        KeyedTask(task_id=f"t{n}", task_name="shop.tasks.sync", key=key, ticket=1, status="succeeded",
                  enqueued_at=timezone.now())
        for n, key in enumerate(keys)
    )  # fmt: skip
    write_key_words(keys)
    assert {KeyedTask.objects.get(pk=pk).key for pk in search(admin_client, "a b c d e f g h")} == {keys[0]}

    term = " ".join("x" * 100)  # 199 characters: 99 separators
    with CaptureQueriesContext(connection) as queries:
        admin_client.get(reverse("admin:keyed_queue_keyedtask_changelist"), {"q": term})
    separators_read = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("SELECT EXISTS(")]
    assert len(separators_read) <= FLEXIBLE_SEPARATORS + 1, "one query per separator read, and one for the end"


# -- any term --

#: Pieces of what the rows hold, cut and with their separators swapped, and text that is none of it.
WORDS = ("6", "60", "9", "3", "42", "1", "b", "c", "invoice", "lead", "account", "send_invoice", "tasks.send_invoice")
PIECES = st.sampled_from([*KEYS, *NAMES, *ODD_TASK_IDS, *WORDS])
SWAPPED = st.builds(
    lambda piece, cut, sep: re.sub(r"[ :/\-_.|#,;=+@]", sep, piece)[:cut],
    PIECES,
    st.integers(1, 25),
    st.sampled_from(SEPARATORS),
)
ODD = st.text(st.characters(codec="utf-8"), max_size=20)  # any text a URL can carry: no lone surrogates
TERMS = st.one_of(
    SWAPPED,
    PIECES,
    st.text(alphabet="a6c:%_\\ \x00é/.", max_size=10),
    ODD,
    st.builds(lambda piece, pad: pad + piece + pad, PIECES, st.sampled_from([" ", "  ", "\t"])),
    st.integers(150, 300).map(lambda n: "a" * n),
    st.just("x" * 10_000),
    st.integers(0, 100).map(str),  # a number, maybe a key's word or a task id's start
    st.text(alphabet=SEPARATORS + "\t", min_size=1, max_size=5),  # separators only
    st.builds(lambda n: "9" * n, st.integers(150, 250)),  # one word longer than any key
)


@pytest.mark.parametrize(
    ("few_matches", "word_keys_max"),
    [
        (changelist.FEW_MATCHES, search_module.WORD_KEYS_MAX),
        (0, search_module.WORD_KEYS_MAX),
        (changelist.FEW_MATCHES, 1),
    ],
    ids=["ids-of-few-matches", "walk-of-many", "words-of-many-keys"],
)
@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])  # fmt: skip
@given(typed=TERMS)
def test_any_term_lists_exactly_the_rows_that_match_it_keys_first(
    admin_client, rows, monkeypatch, few_matches, word_keys_max, typed
):
    monkeypatch.setattr(changelist, "FEW_MATCHES", few_matches)
    monkeypatch.setattr(search_module, "WORD_KEYS_MAX", word_keys_max)
    ids, links, _ = open_page(admin_client, f"?q={quote(typed)}")
    want = expected(rows, typed)
    assert all(matches(typed, row) for row in by_pk(rows, ids)), typed
    assert ids == want[:PER_PAGE], typed
    assert ("older" in links) == (len(want) > PER_PAGE), typed
