"""Retries, ``Ignore`` and ``Reject``, on plain tasks and their keyed twins."""

from __future__ import annotations

import pytest
from celery.exceptions import Reject

from testproject.compat.tasks import add, flaky, ignored, rejected, retry_and_go_on, unreachable
from tests.compat.cases import MARKS, PLAIN, check_key, events, hold_key, journal_has, kinds, starts, worker_log
from tests.waiting import wait_until

pytestmark = MARKS


def postruns(task_id: str) -> int:
    from testproject.compat import journal

    return sum(1 for e in journal.read() if (e["event"], e.get("id")) == ("signal:task_postrun", task_id))


@kinds()
def test_retry_with_a_countdown_runs_again_after_it(kind, key, workers):
    hold_key(kind, key)
    retried = flaky(kind).delay(2, key=key, countdown=0.5)
    after = add(kind).delay(1, 1, key=key)
    wait_until(lambda: retried.state == "RETRY", 10, 0.02, "the RETRY state during the countdown")
    assert retried.get(timeout=10) == 2, "the third attempt (retries == 2) succeeded"
    assert retried.state == "SUCCESS"
    attempts = [e for e in events(key, "start") if e["id"] == retried.id]
    assert [e["attempt"] for e in attempts] == [0, 1, 2]
    gaps = [b["t"] - a["t"] for a, b in zip(attempts, attempts[1:], strict=False)]
    assert min(gaps) >= 0.45, f"each retry waited its countdown: {gaps}"
    assert after.get(timeout=10) == 2
    if kind != PLAIN:  # the key stays held through the retries: the next task runs after them
        assert [i for i in starts(key) if i in (retried.id, after.id)] == [retried.id] * 3 + [after.id]
    check_key(kind, key)


@kinds()
def test_autoretry_for_gives_up_after_max_retries_and_fails(kind, key, workers):
    hold_key(kind, key)
    gives_up = unreachable(kind).delay(key=key)
    after = add(kind).delay(1, 1, key=key)
    with pytest.raises(ConnectionError, match="the endpoint did not answer"):
        gives_up.get(timeout=10)
    assert gives_up.state == "FAILURE"
    assert starts(key).count(gives_up.id) == 3, "the first attempt and max_retries=2 retries"
    assert after.get(timeout=10) == 2
    if kind != PLAIN:
        assert [i for i in starts(key) if i in (gives_up.id, after.id)] == [gives_up.id] * 3 + [after.id]
    check_key(kind, key)


@kinds()
def test_retry_without_throw_goes_on_and_the_retry_runs(kind, key, workers):
    """The first attempt returns after ``self.retry(throw=False)``; its SUCCESS stays (Celery never
    overwrites a SUCCESS), and the retry runs all the same."""
    hold_key(kind, key)
    result = retry_and_go_on(kind).delay(key=key)
    assert result.get(timeout=10) == "attempt 0"
    assert journal_has("went on", result.id), "the first attempt went on after self.retry(throw=False)"
    wait_until(lambda: postruns(result.id) == 2, 10, message="the retry to run")
    assert [e["attempt"] for e in events(key, "start") if e["id"] == result.id] == [0, 1]
    assert result.backend.get_task_meta(result.id, cache=False)["result"] == "attempt 0"
    check_key(kind, key)


@kinds()
def test_ignore_leaves_the_state_alone_and_stores_nothing(kind, key, workers):
    hold_key(kind, key)
    result = ignored(kind).delay(key=key)
    after = add(kind).delay(1, 1, key=key)
    wait_until(lambda: f"[{result.id}] ignored" in worker_log(workers), 10, message="the worker to log it ignored")
    assert after.get(timeout=10) == 2, "the next task (of its key) runs"
    assert result.state == "PENDING"
    assert result.backend.get(result.backend.get_key_for_task(result.id)) is None, "no result stored"
    check_key(kind, key, order=[result.id, after.id])


@kinds()
def test_reject_without_requeue_drops_the_message_and_fails_the_task(kind, key, workers):
    """Celery 5.7 stores a FAILURE for a message rejected without requeue (it will never run again)."""
    hold_key(kind, key)
    result = rejected(kind).delay(False, key=key)
    after = add(kind).delay(1, 1, key=key)
    line = f"[{result.id}] reject requeue=False: rejected on purpose"
    wait_until(lambda: line in worker_log(workers), 10, message="the worker to log it rejected")
    assert after.get(timeout=10) == 2, "the next task (of its key) runs"
    wait_until(lambda: result.state != "PENDING", 3, message="a state")
    assert result.state == "FAILURE"
    assert isinstance(result.result, Reject)
    assert starts(key).count(result.id) == 1, "run once: its message is gone"
    check_key(kind, key, order=[result.id, after.id])


@kinds()
def test_reject_with_requeue_delivers_the_message_again(kind, key, workers):
    hold_key(kind, key)
    result = rejected(kind).delay(True, key=key)
    after = add(kind).delay(1, 1, key=key)
    # Done when it succeeded, or once the next task of its key ran without it.
    wait_until(lambda: result.ready() or (kind != PLAIN and after.ready()), 5, message="the redelivery")
    assert result.get(timeout=1) == "delivery 2"
    assert starts(key).count(result.id) == 2
    assert after.get(timeout=10) == 2
    if kind != PLAIN:  # the requeued task keeps its place: the next task runs after its redelivery
        assert [i for i in starts(key) if i in (result.id, after.id)] == [result.id, result.id, after.id]
    check_key(kind, key)
