"""An operator's limit and rate for one key: ``set_limits`` and ``keyed_queue_limit``,
repeated, raced, fed bad input, and named by the explanation of a waiting task."""

import io
import json

import pytest
from django.contrib.admin.models import LogEntry
from django.core.management import CommandError, call_command
from django.urls import reverse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_keyed_queue import ActionRefused, explain, set_limits
from django_keyed_queue.gate import Finish, Start
from django_keyed_queue.gate.keys import OVERRIDDEN_KEYS, KeyNames
from django_keyed_queue.process.state import get_gate
from django_keyed_queue.records.models import KeyedTask
from django_keyed_queue.testing import write_submission_rows
from testproject.demo.tasks import step
from tests.django.queues import QUEUE
from tests.django.test_operator_races import race

pytestmark = pytest.mark.django_db(transaction=True)


def published(broker) -> set[str]:
    return {json.loads(m)["headers"]["id"] for m in broker.lrange(QUEUE, 0, -1)}


def submit(key: str, n: int) -> list[str]:
    return [step.apply_async((key, i), queue=QUEUE).id for i in range(n)]


def command(*args: str) -> str:
    out = io.StringIO()
    call_command("keyed_queue_limit", *args, stdout=out)
    return out.getvalue()


def test_a_raised_limit_dispatches_the_keys_waiting_tasks_now_and_no_other_keys(gate_redis, broker):
    ids = submit("a", 4)
    other = submit("b", 2)
    write_submission_rows()

    dispatched = set_limits(key="a", limit=3, by="ops")

    assert dispatched.published == 2
    assert published(broker) == {ids[0], other[0], ids[1], ids[2]}
    assert KeyedTask.objects.get(task_id=ids[2]).status == "dispatched"
    assert KeyedTask.objects.get(task_id=other[1]).status == "waiting"


def test_back_to_the_tasks_own_limit_after_default(gate_redis, broker):
    set_limits(key="a", limit=2)
    ids = submit("a", 3)
    assert published(broker) == set(ids[:2])

    set_limits(key="a", limit=None)

    gate = get_gate()
    assert list(gate.inspect("a").holders) == [1], "one at a time again: the second, never started, waits again"
    write_submission_rows()
    assert "taken back by an operator's limit, its tasks' own again," in KeyedTask.objects.get(task_id=ids[1]).error
    first = gate.start(Start("a", 1, 1))
    assert [g.ticket for g in gate.finish(Finish("a", 1, first.token, limit=1)).granted] == [2]
    assert get_gate().inspect("a").limit_override is None and not gate_redis.sismember(OVERRIDDEN_KEYS, "a")


def test_setting_a_limit_twice_or_racing_two_operators_dispatches_once(gate_redis, broker):
    submit("a", 5)

    outcomes = race(lambda: set_limits(key="a", limit=3), lambda: set_limits(key="a", limit=3))
    set_limits(key="a", limit=3)

    assert sorted(o.published for o in outcomes) == [0, 2]
    assert len(published(broker)) == 3


@pytest.mark.parametrize("bad", [0, -1, True, "3", 1.5, 1_000_001])
def test_a_bad_limit_is_refused_and_nothing_is_written(gate_redis, broker, bad):
    with pytest.raises(ActionRefused, match="a key's limit is a whole number from 1 to 1000000"):
        set_limits(key="a", limit=bad)
    assert gate_redis.dbsize() == 0


@pytest.mark.parametrize("bad", ["fast", "0/s", "10/d", "1.5/s", "", 10])
def test_a_bad_rate_is_refused_and_nothing_is_written(gate_redis, broker, bad):
    with pytest.raises(ActionRefused, match="a key's rate must be"):
        set_limits(key="a", rate=bad)
    assert gate_redis.dbsize() == 0


def test_a_limit_and_a_rate_are_set_together_and_a_bad_one_sets_neither(gate_redis, broker):
    set_limits(key="a", limit=2, rate="10/s")
    state = get_gate().inspect("a")
    assert (state.limit_override, state.interval_override_ms) == (2, 100)
    with pytest.raises(ActionRefused, match="a key's rate must be"):
        set_limits(key="a", limit=5, rate="fast")
    assert get_gate().inspect("a").limit_override == 2, "the good limit beside a bad rate is not set"


@pytest.mark.parametrize("named", [{}, {"key": "a", "pool": "one"}])
def test_set_limits_names_a_key_or_a_pool_and_refuses_both_or_neither(gate_redis, broker, named):
    with pytest.raises(TypeError, match="takes a key or a pool, not both or neither"):
        set_limits(**named, limit=2)
    assert gate_redis.dbsize() == 0


def test_a_rate_is_kept_as_the_least_time_between_starts(gate_redis, broker):
    set_limits(key="a", rate="10/s")
    assert get_gate().inspect("a").interval_override_ms == 100
    set_limits(key="a", rate=None)
    assert get_gate().inspect("a").interval_override_ms is None


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.text(max_size=300) | st.just("\x00") | st.just("k" * 201))
def test_any_key_is_taken_whole_or_refused_with_nothing_written(gate_redis, broker, key):
    try:
        set_limits(key=key, limit=2)
    except ActionRefused as refused:
        assert "a key is 1 to 200 characters" in str(refused)
        assert not gate_redis.exists(KeyNames(key).meta) if key else True
        return
    assert get_gate().inspect(key).limit_override == 2
    set_limits(key=key, limit=None)
    assert not gate_redis.exists(KeyNames(key).meta)


def test_the_command_sets_shows_and_resets_a_keys_limit_and_rate(gate_redis, broker):
    submit("a", 3)

    said = command("a", "2", "--rate", "5/s")

    assert "limit 2; 1 dispatched" in said and "rate 5/s" in said and "limit 2, rate 5/s" in said
    assert command("a") == "key 'a': limit 2, rate 5/s\n"
    assert command("a", "default", "--rate", "default").endswith("limit default (its tasks'), rate default\n")


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("a", "x"), "the limit is a whole number"),
        (("a", "0"), "from 1 to"),
        (("a", "5", "--rate", "abc"), "rate"),  # a good limit beside a bad rate: neither is set
        (("a", "0", "--rate", "5/s"), "from 1 to"),
    ],
)
def test_the_command_refuses_a_bad_limit(gate_redis, broker, args, error):
    with pytest.raises(CommandError, match=error):
        command(*args)
    assert gate_redis.dbsize() == 0


def test_the_explanation_of_a_waiting_task_names_the_operators_limit(gate_redis, broker):
    ids = submit("a", 3)
    set_limits(key="a", limit=2)
    write_submission_rows()

    reasons = explain(ids[2]).reasons

    assert "its key's limit is 2, set by an operator over its task's own 1" in reasons


# --- the live keys page --------------------------------------------------------------------------------


def test_the_live_keys_page_sets_shows_and_resets_a_keys_limit_and_rate(gate_redis, broker, as_user):
    submit("a", 3)
    write_submission_rows()
    client = as_user("lena", "change_key_limits")
    url = reverse("admin:keyed_queue_key_act")

    client.post(url, {"action": "limit", "key": "a", "limit": "3", "rate": "10/s"})

    state = get_gate().inspect("a")
    assert (state.limit_override, state.interval_override_ms, len(state.holders)) == (3, 100, 3)
    page = client.get(reverse("admin:keyed_queue_keys"), {"key": "a"}).content.decode()
    assert "limit 3" in page and "rate 10/s" in page and 'value="limit"' in page
    client.post(url, {"action": "limit", "key": "a", "limit": "default", "rate": "default"})
    state = get_gate().inspect("a")
    assert (state.limit_override, state.interval_override_ms) == (None, None)
    assert [e.change_message for e in LogEntry.objects.order_by("id")] == [
        "Key 'a': limit 3; 2 dispatched, rate 10/s, set by lena",
        "Key 'a': limit default; 0 dispatched, 2 granted but not started wait again, rate default, set by lena",
    ]


@pytest.mark.parametrize(
    "form",
    [
        {"limit": "abc"},
        {"limit": "0"},
        {"rate": "fast"},
        {"limit": "²"},
        {"limit": "5", "rate": "abc"},
        {"limit": "0", "rate": "5/s"},
    ],
)
def test_the_live_keys_page_refuses_a_bad_limit_or_rate_and_writes_nothing(gate_redis, broker, as_user, form):
    client = as_user("lena", "change_key_limits")

    response = client.post(reverse("admin:keyed_queue_key_act"), {"action": "limit", "key": "a", **form}, follow=True)

    assert "key&#x27;s" in response.content.decode()
    assert gate_redis.dbsize() == 0 and not LogEntry.objects.exists()


def test_setting_a_keys_limit_needs_its_own_permission(gate_redis, broker, as_user):
    submit("a", 2)
    client = as_user("vic", "pause_key", "resume_key", "release_keyedtask")

    response = client.post(reverse("admin:keyed_queue_key_act"), {"action": "limit", "key": "a", "limit": "2"})

    assert response.status_code == 403
    assert get_gate().inspect("a").limit_override is None and not LogEntry.objects.exists()
    page = client.get(reverse("admin:keyed_queue_keys")).content.decode()
    assert 'value="limit"' not in page, "the form is not shown either"


def test_a_lowered_limit_puts_back_the_tasks_granted_but_not_started(gate_redis, broker):
    ids = submit("a", 6)
    set_limits(key="a", limit=5)
    write_submission_rows()
    assert get_gate().start(Start("a", 1, 1, task_id=ids[0])).ok

    said = command("a", "1")

    assert "4 granted but not started wait again" in said
    state = get_gate().inspect("a")
    assert list(state.holders) == [1] and state.waiting == [2, 3, 4, 5, 6]
    rows = {t.task_id: t for t in KeyedTask.objects.filter(task_id__in=ids)}
    assert [rows[i].status for i in ids[1:5]] == ["waiting"] * 4, "their records say they wait again"
    assert all("lower limit 1" in rows[i].error and rows[i].dispatched_at is None for i in ids[1:5])
    assert explain(ids[1]).reasons[-1] == "it is next in its key's queue"


def test_a_granted_task_of_a_key_given_a_rate_says_when_it_starts_and_whose_rate(gate_redis, broker):
    set_limits(key="a", rate="1/m")
    first, second = submit("a", 2)
    write_submission_rows()
    gate = get_gate()
    started = gate.start(Start("a", 1, 1, task_id=first))
    assert gate.finish(Finish("a", 1, started.token)).granted, "the second is granted, to start when the rate lets it"

    reason = explain(second).reasons[0]

    assert reason.startswith("it starts at ") and "its key's rate (an operator's, over its task's) is 1/m" in reason
    assert reason.endswith("a worker told to wait under an earlier rate starts it when told")


def test_a_grant_taken_back_and_started_again_before_its_record_is_written_keeps_its_run(gate_redis, broker):
    ids = submit("a", 2)
    set_limits(key="a", limit=2)
    write_submission_rows()
    KeyedTask.objects.filter(task_id=ids[1]).update(status="running", attempts=1)  # its worker's write won the race

    set_limits(key="a", limit=1)

    assert KeyedTask.objects.get(task_id=ids[1]).status == "running", "a run's record is never told it waits"


@pytest.mark.parametrize(
    "named", [{"key": "a\x00b"}, {"key": "k" * 10_000}, {"key": ""}, {"key": 7}, {"pool": "no such pool"}, {"pool": 7}]
)
def test_set_limits_refuses_a_key_or_pool_it_cannot_name_and_writes_nothing(gate_redis, broker, named):
    with pytest.raises(ActionRefused):
        set_limits(**named, limit=2, rate="1/s")
    assert gate_redis.dbsize() == 0
