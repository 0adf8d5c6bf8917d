"""Runs Celery kills on purpose, on real workers: they are not run again, and their key moves on at once.

The session's workers keep the default 60 s lease: a key that waited for the
lease of a killed run would miss these tests' deadlines.
"""

import pytest

from django_keyed_queue.records.models import KeyedTask
from testproject.demo.history import read as read_history
from testproject.demo.tasks import hard_limited_step, lingering_step, step
from tests.waiting import wait_for_records, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.workers]


def starts_of(key: str, n: int) -> int:
    return sum(1 for e in read_history() if (e["event"], e["key"], e["n"]) == ("start", key, n))


def test_a_run_revoked_with_terminate_is_not_run_again_and_its_key_moves_on(workers, gate_redis):
    killed = lingering_step.delay("terminated", 1, 30.0)  # its first attempt lingers 30 s
    after = step.delay("terminated", 2)
    wait_until(lambda: starts_of("terminated", 1), 20, message="the run to start")

    killed.revoke(terminate=True)
    records = wait_for_records([killed.id, after.id], timeout=20)

    assert records[killed.id].status == "cancelled"
    assert "revoked by Celery, its process terminated (SIGTERM)" in records[killed.id].error
    assert records[after.id].status == "succeeded"
    assert starts_of("terminated", 1) == 1, "the terminated run is not dispatched again"
    assert not any(e["event"] == "end" and e["n"] == 1 for e in read_history() if e["key"] == "terminated")


def test_a_run_past_its_hard_time_limit_fails_and_is_not_run_again(workers, gate_redis):
    limited = hard_limited_step.delay("time-limited", 1, 5.0)  # killed by its worker after 1 s
    after = step.delay("time-limited", 2)

    records = wait_for_records([limited.id, after.id], timeout=20)

    assert records[limited.id].status == "failed"
    assert "hard time limit exceeded" in records[limited.id].error
    assert records[after.id].status == "succeeded"
    assert starts_of("time-limited", 1) == 1, "the killed run is not dispatched again"
    assert KeyedTask.objects.get(task_id=after.id).started_at >= records[limited.id].finished_at
