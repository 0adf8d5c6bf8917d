"""Every public way in, fuzzed (hypothesis): any key, arguments, task id, idempotency key, countdown or
option is either submitted once, with a row that says what was submitted, or refused with our error,
leaving nothing behind; on SQLite and on PostgreSQL (``KEYED_QUEUE_TESTS_DATABASE=postgresql``)."""

import json
import math

import pytest
from django.db import transaction
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from django_keyed_queue import KeyedQueueError
from django_keyed_queue.records.models import IdempotencyKey, KeyedTask
from django_keyed_queue.testing import write_submission_rows
from testproject.demo.tasks import step
from tests.django.queues import QUEUE

pytestmark = pytest.mark.django_db

#: Any text a caller may pass: NUL, lone surrogates, any plane; short, long, and past every column.
TEXT = st.one_of(
    st.text(st.characters(codec=None, categories=None), max_size=40),
    st.text(alphabet="k\x00é\ud800{}%", max_size=12),
    st.integers(min_value=190, max_value=320).map(lambda n: "x" * n),
    st.just("x" * 5000),
)
#: Values of the wrong type, and ones JSON cannot encode.
ODD = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.binary(max_size=8), st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2), st.just(object()), st.just({1, 2}),
)  # fmt: skip
ANY = st.one_of(TEXT, ODD)

CALLS = st.fixed_dictionaries(
    {"key": ANY, "n": ANY},
    optional={
        "task_id": ANY,
        "idempotency_key": ANY,
        "countdown": st.one_of(st.floats(allow_nan=True), st.integers(-5, 5), TEXT),
        "priority": st.one_of(st.integers(-3, 300), TEXT),
        "argsrepr": ANY,
    },
)
WAYS_IN = ["apply_async", "apply_async_many", "on_commit"]
#: What Celery's ``apply_async`` raises for options it cannot use (a countdown past year 9999: OverflowError).
CELERY_ERRORS = (TypeError, ValueError, OverflowError)


def reset(gate_redis, broker) -> None:
    gate_redis.flushdb()
    broker.delete(QUEUE)
    KeyedTask.objects.all().delete()
    IdempotencyKey.objects.all().delete()


def submit(how: str, call: dict):
    options = {k: v for k, v in call.items() if k not in ("key", "n")}
    args = (call["key"], call["n"])
    if how == "apply_async":
        return [step.apply_async(args, queue=QUEUE, **options)]
    if how == "apply_async_many":
        key = options.pop("idempotency_key", None)
        options.pop("task_id", None)  # names one task: a bulk submission refuses it
        return step.apply_async_many([args], idempotency_keys=[key], queue=QUEUE, **options)
    with transaction.atomic():
        result = step.apply_async_on_commit(args, queue=QUEUE, **options)
    return [result]


def celery_refuses(call: dict, error: Exception) -> bool:
    """Celery's own checks of its options, which a plain task makes too (a countdown or priority it
    cannot use): raised as Celery raises them, before anything is written."""
    return isinstance(error, CELERY_ERRORS) and bool({"countdown", "priority"} & set(call))


@pytest.mark.parametrize("how", WAYS_IN)
@settings(max_examples=120, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])  # fmt: skip
@given(call=CALLS)
def test_any_submission_is_written_once_or_refused_with_nothing_left(how, call, gate_redis, broker):
    reset(gate_redis, broker)
    try:
        results = submit(how, call)
    except KeyedQueueError as error:
        refused = type(error).__name__
    except CELERY_ERRORS as error:
        if not celery_refuses(call, error):
            raise
        refused = f"Celery's {type(error).__name__}"
    else:
        refused = ""
    event(f"refused: {refused}" if refused else "submitted")
    if refused:
        assert gate_redis.dbsize() == 0 and broker.llen(QUEUE) == 0
        assert not KeyedTask.objects.exists() and not IdempotencyKey.objects.exists()
        return
    if how == "on_commit":
        # The test's transaction never commits: nothing may have been written yet.
        assert gate_redis.dbsize() == 0 and broker.llen(QUEUE) == 0
        return
    write_submission_rows()
    [result] = results
    [row] = KeyedTask.objects.all()
    assert (row.task_id, row.key, row.task_name) == (result.id, "{key}".format(key=call["key"]), step.name)
    delayed = call.get("countdown") not in (None, 0) and not (
        isinstance(call.get("countdown"), float) and math.isnan(call["countdown"])
    )
    if not delayed and not call.get("priority"):  # kombu keeps a message with a priority in a list of its own
        [sent] = [json.loads(m) for m in broker.lrange(QUEUE, 0, -1)]
        assert sent["headers"]["id"] == result.id
