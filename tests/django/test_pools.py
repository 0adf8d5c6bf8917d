"""Pools in a project: ``KEYED_QUEUE_POOLS`` read and refused, ``pool=`` checked at import, and an operator's
limit and rate for a pool (``keyed_queue_limit --pool``), repeated, raced and fed bad input."""

import io
import json

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.test import override_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_keyed_queue import keyed_serial_task
from django_keyed_queue.checks import check_settings
from django_keyed_queue.gate import Code, Pool
from django_keyed_queue.gate.keys import PoolNames
from django_keyed_queue.pools import configured_pools
from django_keyed_queue.process.state import get_gate
from django_keyed_queue.process.totals import template_of
from django_keyed_queue.records.models import KeyedTask
from django_keyed_queue.testing import write_submission_rows
from testproject.demo.tasks import step
from tests.django.queues import QUEUE
from tests.django.test_operator_races import race

pytestmark = pytest.mark.django_db(transaction=True)

POOLS = {"payments": {"limit": 10, "rate": "20/s"}, "mail": {"rate": "5/s"}, "one": {"limit": 1}}


def command(*args: str) -> str:
    out = io.StringIO()
    call_command("keyed_queue_limit", *args, stdout=out)
    return out.getvalue()


@override_settings(KEYED_QUEUE_POOLS=POOLS)
def test_the_settings_pools_as_the_gate_takes_them():
    assert configured_pools() == {
        "payments": Pool("payments", limit=10, interval_ms=50),
        "mail": Pool("mail", limit=0, interval_ms=200),
        "one": Pool("one", limit=1, interval_ms=0),
    }


BAD_POOLS = [
    ([("payments", 10)], "must be a dict of pool name"),
    ({"": {"limit": 1}}, "a pool's name must be a text of 1 to 200"),
    ({"a\0b": {"limit": 1}}, "no NUL"),
    ({"x" * 201: {"limit": 1}}, "1 to 200"),
    ({3: {"limit": 1}}, "a pool's name must be a text"),
    ({"p": {}}, 'must be a dict with a "limit", a "rate" or both'),
    ({"p": 5}, 'must be a dict with a "limit"'),
    ({"p": {"limit": 0}}, "KEYED_QUEUE_POOLS\\['p'\\]\\[\"limit\"\\] must be a whole number >= 1, got 0"),
    ({"p": {"limit": True}}, "whole number >= 1, got True"),
    ({"p": {"limit": "3"}}, "whole number >= 1, got '3'"),
    ({"p": {"rate": "fast"}}, 'KEYED_QUEUE_POOLS\\[\'p\'\\]\\["rate"\\]: rate must be "N/s"'),
    ({"p": {"rate": "5000/s"}}, "at most 1000/s"),
    ({"p": {"limit": 2, "burst": 3}}, "unknown option 'burst'"),
    ({"p": {"limit": None}}, 'must give a "limit", a "rate" or both'),
]


@pytest.mark.parametrize(("pools", "said"), BAD_POOLS)
def test_bad_pools_are_refused_naming_what_is_wrong(pools, said):
    with override_settings(KEYED_QUEUE_POOLS=pools):
        with pytest.raises(ImproperlyConfigured, match=said):
            configured_pools()
        (problem,) = [p for p in check_settings() if p.id == "keyed_queue.E013"]
        assert problem.msg == str(pytest.raises(ImproperlyConfigured, configured_pools).value)


VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True),
    st.text(max_size=3000),
    st.binary(max_size=50),
    st.lists(st.integers(), max_size=3),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    name=st.one_of(st.text(max_size=300), st.integers(), st.none()),
    options=st.one_of(VALUES, st.dictionaries(st.sampled_from(["limit", "rate", "Limit", "\0"]), VALUES, max_size=3)),
)
def test_any_pools_setting_is_read_or_refused_clearly(name, options):
    """NUL, huge, unicode and wrong types: a pool is read, or refused with ImproperlyConfigured naming the
    setting (never another error, and never a text of thousands of characters)."""
    with override_settings(KEYED_QUEUE_POOLS={name: options}):
        try:
            pools = configured_pools()
        except ImproperlyConfigured as exc:
            assert str(exc).startswith("KEYED_QUEUE_POOLS") and len(str(exc)) < 600
            return
    (pool,) = pools.values()
    assert pool.name == name and (pool.limit or pool.interval_ms)


@override_settings(KEYED_QUEUE_POOLS=POOLS)
def test_a_task_naming_a_pool_the_settings_lack_fails_at_import():
    with pytest.raises(ImproperlyConfigured, match=r"names pool 'payment', which KEYED_QUEUE_POOLS lacks \(it has:"):
        keyed_serial_task(key="{n}", pool="payment")
    with pytest.raises(TypeError, match="pool must be the name of a pool"):
        keyed_serial_task(key="{n}", pool=["payments"])

    @keyed_serial_task(key="{n}", pool="payments", name="tests.pools.paid")
    def paid(n):
        return n

    assert paid.serial_pool == "payments"


def _waiting_for_pool(gate, key: str) -> tuple[int, str]:
    """A task of ``key`` whose pool "one" had no slot at its start (as a worker leaves it)."""
    result = step.apply_async((key, 0), queue=QUEUE)
    ticket = gate.inspect(key).holders.popitem()[0]
    acquired = gate.pool_acquire(Pool("one", limit=1, interval_ms=0), key, ticket)
    if acquired.code is Code.PARKED:
        assert gate.pool_wait(key, ticket, 1, pool="one")
    return ticket, result.id


@override_settings(KEYED_QUEUE_POOLS=POOLS)
def test_a_raised_pool_limit_dispatches_waiting_tasks_now(gate_redis, broker):
    gate = get_gate()
    _waiting_for_pool(gate, "a")  # takes the one slot
    ticket, waiting_id = _waiting_for_pool(gate, "b")
    assert gate.inspect("b").holders[ticket].state == "waiting_for_pool"
    broker.delete(QUEUE)

    said = command("--pool", "one", "2")

    assert "pool 'one': limit 2" in said and "2 running, 0 waiting" in said, said
    assert [json.loads(m)["headers"]["id"] for m in broker.lrange(QUEUE, 0, -1)] == [waiting_id]
    assert gate.inspect("b").holders[ticket].state == "granted"
    repeat = command("--pool", "one", "2")
    assert repeat.endswith("limit 2, rate default (none, the settings'); 2 running, 0 waiting\n"), "a repeat"
    assert broker.llen(QUEUE) == 1, "a repeat publishes nothing"

    said = command("--pool", "one", "default", "--rate", "10/s")
    assert "limit default (1, the settings')" in said and "rate 10/s" in said, said
    assert gate_redis.hget(PoolNames("one").meta, "interval_override") == b"100"


@override_settings(KEYED_QUEUE_POOLS=POOLS)
def test_racing_operators_give_one_effect(gate_redis, broker):
    gate = get_gate()
    _waiting_for_pool(gate, "a")
    for key in ("b", "c", "d"):
        _waiting_for_pool(gate, key)
    broker.delete(QUEUE)

    race(*[lambda: command("--pool", "one", "3")] * 4)

    assert broker.llen(QUEUE) == 2, "two slots more, two tasks published, whoever ran first"
    assert gate.inspect_pool("one").limit == 3


@override_settings(KEYED_QUEUE_POOLS=POOLS)
@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--pool", "nope", "3"), "no pool 'nope'; the pools are: 'mail', 'one', 'payments'"),
        (("--pool", "one", "0"), "a pool's limit is a whole number from 1"),
        (("--pool", "one", "x"), "the limit is a whole number >= 1 or 'default', got 'x'"),
        (("--pool", "one", "3", "4"), "with --pool, give only the limit"),
        (("--pool", "one", "--rate", "9/x"), "a pool's rate must be"),
        ((), "give a key (e.g. account:7), or --pool"),
    ],
)
def test_bad_pool_commands_are_refused_and_change_nothing(gate_redis, args, said):
    with pytest.raises(CommandError, match=said.replace("(", r"\(").replace(")", r"\)")):
        command(*args)
    assert gate_redis.hgetall(PoolNames("one").meta) == {}


@override_settings(KEYED_QUEUE_POOLS=POOLS)
def test_a_task_waiting_for_its_pool_is_explained_by_its_pool(gate_redis, broker):
    from django_keyed_queue import explain
    from django_keyed_queue.testing import write_submission_rows

    @keyed_serial_task(key="{key}", pool="one", name="tests.pools.paid_one")
    def paid_one(key):
        return key

    gate = get_gate()
    results = [paid_one.apply_async((key,), queue=QUEUE) for key in ("a", "b", "c")]
    write_submission_rows()
    for key in ("a", "b", "c"):  # as the workers leave them: a runs, b and c wait for the pool in turn
        ticket = gate.inspect(key).holders.popitem()[0]
        if gate.pool_acquire(Pool("one", limit=1, interval_ms=0), key, ticket).code is Code.PARKED:
            assert gate.pool_wait(key, ticket, 1, pool="one")

    b, c = explain(results[1].id), explain(results[2].id)

    assert b.state == c.state == "waiting for its pool"
    running = f"1 of 1 running: tests.pools.paid_one[{results[0].id}]"
    assert b.reasons[0] == f"waiting for pool 'one' ({running}); it is next in its pool's line"
    assert c.reasons[0] == f"waiting for pool 'one' ({running}); 1 task of the pool waits ahead of it"
    command("--pool", "one", "2")
    assert explain(results[1].id).state == "dispatched", "given a slot: published again"


# --- the live keys page --------------------------------------------------------------------------------


@override_settings(KEYED_QUEUE_POOLS=POOLS)
def test_the_live_keys_page_shows_each_pool_and_sets_its_limit(gate_redis, broker, as_user):
    from django.contrib.admin.models import LogEntry
    from django.urls import reverse

    gate = get_gate()
    _waiting_for_pool(gate, "a")
    _waiting_for_pool(gate, "b")
    client = as_user("lena", "change_key_limits")

    page = client.get(reverse("admin:keyed_queue_keys")).content.decode()
    row = page[page.index('data-pool="one"') :].split("</tr>")[0]
    assert "1 of 1" in row and '<td class="waiting">1</td>' in row and 'value="pool_limit"' in row
    assert 'data-pool="mail"' in page and "5/s" in page

    client.post(reverse("admin:keyed_queue_key_act"), {"action": "pool_limit", "pool": "one", "limit": "2"})
    client.post(reverse("admin:keyed_queue_key_act"), {"action": "pool_limit", "pool": "one", "limit": "2"})

    assert gate.inspect_pool("one").limit_override == 2 and broker.llen(QUEUE) == 3, "b published once more, once"
    assert [e.change_message for e in LogEntry.objects.order_by("id")] == [
        "Pool 'one': limit 2; 1 dispatched, set by lena",
        "Pool 'one': limit 2; 0 dispatched, set by lena",
    ]
    assert {e.object_repr for e in LogEntry.objects.all()} == {"pool one"}, "a pool, not a key, is named"


@override_settings(KEYED_QUEUE_POOLS=POOLS)
@pytest.mark.parametrize(
    ("form", "status"),
    [
        ({"pool": "one", "limit": "0"}, 302),
        ({"pool": "nope", "limit": "2"}, 302),
        ({"pool": "one", "rate": "fast"}, 302),
        ({"pool": "", "limit": "2"}, 400),
        ({"pool": "a\0b", "limit": "2"}, 400),
    ],
)
def test_the_live_keys_page_refuses_a_bad_pool_limit_and_writes_nothing(gate_redis, as_user, form, status):
    from django.contrib.admin.models import LogEntry
    from django.urls import reverse

    client = as_user("lena", "change_key_limits")
    response = client.post(reverse("admin:keyed_queue_key_act"), {"action": "pool_limit", **form})

    assert response.status_code == status
    assert gate_redis.dbsize() == 0 and not LogEntry.objects.exists()


@override_settings(KEYED_QUEUE_POOLS=POOLS)
def test_a_pools_limit_needs_the_permission_a_keys_limit_needs(gate_redis, as_user):
    from django.urls import reverse

    client = as_user("vic", "pause_key", "resume_key", "release_keyedtask")

    response = client.post(reverse("admin:keyed_queue_key_act"), {"action": "pool_limit", "pool": "one", "limit": "2"})

    assert response.status_code == 403 and gate_redis.dbsize() == 0
    assert 'value="pool_limit"' not in client.get(reverse("admin:keyed_queue_keys")).content.decode()


@override_settings(KEYED_QUEUE_POOLS=POOLS)
def test_the_metrics_show_each_pool_s_running_waiting_and_limit(viewer_client, gate_redis, broker):
    from tests.django.test_metrics import scrape, value

    gate = get_gate()
    for key in ("a", "b", "c"):
        _waiting_for_pool(gate, key)
    command("--pool", "payments", "4")

    samples = scrape(viewer_client)

    assert [value(samples, f"keyed_queue_pool_{s}", pool="one") for s in ("running", "waiting", "limit")] == [1, 2, 1]
    assert value(samples, "keyed_queue_pool_limit", pool="payments") == 4, "an operator's, over the settings'"
    assert "mail" not in {labels["pool"] for labels, _ in samples["keyed_queue_pool_limit"]}, "a rate only: no limit"


@override_settings(KEYED_QUEUE_POOLS=POOLS)
def test_the_command_the_live_page_and_the_metrics_tell_a_pool_s_settings_alike(gate_redis, as_user):
    """A pool's configured rate and limit, as the settings give them, where no task of it ran yet; a pool
    with no limit has no limit sample (a 0 would read as nothing may run)."""
    from django.urls import reverse
    from prometheus_client.parser import text_string_to_metric_families

    assert command("--pool", "mail") == "pool 'mail': limit default (none, the settings'), rate default (5/s, the " \
        "settings'); 0 running, 0 waiting\n"  # fmt: skip
    assert "limit default (10, the settings'), rate default (20/s, the settings')" in command("--pool", "payments")
    client = as_user("vic", "view_keyedtask")
    page = client.get(reverse("admin:keyed_queue_keys")).content.decode()
    row = page[page.index('data-pool="mail"') :].split("</tr>")[0]
    assert "0 (no limit)" in row and "5/s" in row
    scraped = client.get("/keyed-queue/metrics/").content.decode()
    limits = {
        s.labels["pool"]: s.value
        for family in text_string_to_metric_families(scraped)
        for s in family.samples
        if s.name == "keyed_queue_pool_limit"
    }
    assert limits == {"payments": 10, "one": 1}, "no sample for the pool with no limit"


@override_settings(KEYED_QUEUE_POOLS=POOLS)
def test_a_task_of_no_key_joins_a_pool_and_nothing_else():
    from django_keyed_queue import pooled_task
    from django_keyed_queue.keyed_task.decorators import POOLED_KEY_LIMIT

    @pooled_task(pool="mail", name="tests.pools.mailer")
    def mailer(to, subject=""):
        return to

    assert mailer.serial_pool == "mail" and mailer.serial_limit == POOLED_KEY_LIMIT
    assert mailer.key_for(("a@example.com",), {}) == mailer.key_for(("b@example.com",), {"subject": "x"})
    assert template_of(mailer) == "keyed_queue.pool:mail", "its metrics' key_template: the key its pool's tasks share"
    with pytest.raises(TypeError, match="takes no key=: its pool decides"):
        pooled_task(pool="mail", key="{to}")
    with pytest.raises(TypeError, match="pool is required"):
        pooled_task(pool=None)
    with pytest.raises(ImproperlyConfigured, match="@pooled_task names pool 'post'"):
        pooled_task(pool="post")


@override_settings(KEYED_QUEUE_POOLS=POOLS)
def test_the_api_sets_a_pool_s_limit_and_rate_once_however_often_asked(gate_redis, broker):
    from django_keyed_queue import ActionRefused, set_limits

    gate = get_gate()
    _waiting_for_pool(gate, "a")
    _waiting_for_pool(gate, "b")
    broker.delete(QUEUE)

    assert set_limits(pool="one", limit=2, by="ops").published == 1
    assert set_limits(pool="one", limit=2, by="ops").published == 0, "a repeat gives nothing more"
    set_limits(pool="one", rate="4/s")
    assert (gate.inspect_pool("one").limit, gate.inspect_pool("one").interval_ms) == (2, 250)
    set_limits(pool="one", limit=None)
    set_limits(pool="one", rate=None)
    assert gate.inspect_pool("one").limit_override is None and gate.inspect_pool("one").interval_override_ms is None
    with pytest.raises(ActionRefused, match="a pool's limit is a whole number"):
        set_limits(pool="one", limit=0)
    with pytest.raises(ActionRefused, match="no pool 'two'"):
        set_limits(pool="two", rate="1/s")


def in_pool_one(task, keys: tuple[str, ...]) -> list[str]:
    """A task of each of ``keys`` (their ids), as the workers leave them: the first holds pool "one"'s one
    slot, the others wait for it in turn; their rows written."""
    gate, ids = get_gate(), []
    for key in keys:
        ids.append(task.apply_async((key, 0), queue=QUEUE).id)
        ticket = gate.inspect(key).holders.popitem()[0]
        if gate.pool_acquire(Pool("one", limit=1, interval_ms=0), key, ticket).code is Code.PARKED:
            assert gate.pool_wait(key, ticket, 1, pool="one")
    write_submission_rows()
    return ids


@override_settings(KEYED_QUEUE_POOLS=POOLS)
def test_a_task_waiting_for_its_pool_is_told_in_words_with_the_pool_s_holders_and_its_pool(gate_redis, broker, as_user):
    """G9 on every surface: "waiting for pool 'one'", never the gate's state name; a holder named by its task,
    never by a ticket; the pool's holders named (linked on its page), and its page names its pool."""
    from django.urls import reverse

    from django_keyed_queue import explain

    @keyed_serial_task(key="{key}", pool="one", name="tests.pools.one_slot")
    def one_slot(key, n):
        return n

    holder, waiting = in_pool_one(one_slot, ("a", "b"))
    admin_client = as_user("vic", "view_keyedtask")
    page = admin_client.get(reverse("admin:keyed_queue_keys")).content.decode()
    row = page[page.index('data-key="b"') :].split("</tr>")[0]
    assert "waiting for pool &#x27;one&#x27;" in row and "waiting_for_pool" not in row, row
    assert f"[{waiting}]" in row and "#1" not in row, row

    why = explain(waiting)
    assert why.reasons[0].startswith(f"waiting for pool 'one' (1 of 1 running: tests.pools.one_slot[{holder}]); ")
    assert [h.task_id for h in why.pool_holders] == [holder] and why.as_data()["pool_holders"][0]["task_id"] == holder
    page = admin_client.get(
        reverse("admin:keyed_queue_keyedtask_change", args=[KeyedTask.objects.get(task_id=waiting).pk])
    )
    text = page.content.decode()
    assert f'?q={holder}">tests.pools.one_slot[{holder}]</a>' in text, "the holder linked"
    assert '<div class="readonly">one</div>' in text, "its page names its pool"
    assert "waiting_for_pool" not in text and "#1" not in text.split('id="why"')[1].split("</fieldset>")[0]
