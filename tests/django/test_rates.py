"""A key's rate is one the gate can keep: its starts are spaced by whole milliseconds, rounded up so a rate
is never exceeded, and a rate above one start a millisecond is refused, naming the most, by the decorator
and by the operator's ``set_limits`` and ``keyed_queue_limit``, with nothing written."""

import io
import re

import pytest
from celery import Celery
from django.core.management import CommandError, call_command
from hypothesis import given
from hypothesis import strategies as st

from django_keyed_queue import ActionRefused, keyed_serial_task, set_limits
from django_keyed_queue.process.state import get_gate
from django_keyed_queue.rates import RATE_PERIODS_MS, rate_interval_ms
from tests.django.test_django_idioms import keyed_task_of

TOO_FAST = ["1001/s", "1000000000/s", "60001/m", "3600001/h", "0002000/s", "9" * 5000 + "/s"]
MOST = re.escape("rate must be at most 1000/s (60000/m, 3600000/h): the gate spaces starts by whole milliseconds")


@pytest.mark.parametrize("rate", TOO_FAST)
def test_a_rate_faster_than_one_start_a_millisecond_fails_at_import_naming_the_most(rate):
    with pytest.raises(ValueError, match=MOST):
        keyed_serial_task(key="{key}", rate=rate)


@pytest.mark.django_db
@pytest.mark.parametrize("rate", TOO_FAST)
def test_an_operator_s_rate_faster_than_that_is_refused_and_nothing_is_written(gate_redis, rate):
    with pytest.raises(ActionRefused, match="a key's " + MOST):
        set_limits(key="a", rate=rate)
    with pytest.raises(CommandError, match=MOST):
        call_command("keyed_queue_limit", "a", "--rate", rate, stdout=io.StringIO())
    assert gate_redis.dbsize() == 0


@pytest.mark.django_db
def test_the_most_is_taken_and_kept_as_one_millisecond(gate_redis):
    task = keyed_task_of(Celery("project", set_as_current=False), rate="1000/s")
    assert (task.serial_rate, task.serial_interval_ms) == ("1000/s", 1)
    for most in ("1000/s", "60000/m", "3600000/h"):
        set_limits(key="a", rate=most)
        assert get_gate().inspect("a").interval_override_ms == 1
    set_limits(key="a", rate=None)


@pytest.mark.parametrize(
    ("rate", "ms"),
    [("3/s", 334), ("7/s", 143), ("10/s", 100), ("30/m", 2000), ("1/h", 3_600_000), ("600/s", 2), ("999/s", 2)],
)
def test_a_rate_is_kept_as_whole_milliseconds_rounded_up(rate, ms):
    assert rate_interval_ms(rate) == ms


@given(period=st.sampled_from(sorted(RATE_PERIODS_MS)), count=st.integers(min_value=1, max_value=3_600_000))
def test_a_kept_rate_is_never_faster_than_asked_and_as_fast_as_whole_milliseconds_allow(period, count):
    period_ms = RATE_PERIODS_MS[period]
    if count > period_ms:
        with pytest.raises(ValueError, match=MOST):
            rate_interval_ms(f"{count}/{period}")
        return
    ms = rate_interval_ms(f"{count}/{period}")
    assert ms * count >= period_ms, "no more than count starts in a period"
    assert (ms - 1) * count < period_ms, "and no slower than the next whole millisecond down would be"
