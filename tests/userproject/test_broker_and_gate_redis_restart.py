"""The one Redis holding the broker and the gate restarts, or cuts its clients, under running keyed tasks.

Workers must live through it as plain Celery's do, no accepted task may be lost
or run twice or out of order, and every key resumes within the lease plus the
reaper period (and a few seconds), not after the dispatch timeout.
"""

import time

import pytest
import redis

from testproject.servers import AOF_ALWAYS, persistent_redis
from tests.userproject.run_checks import accepted_by, assert_workers_survived, check_run, resume_delays
from tests.userproject.test_pools import most_running
from tests.userproject.timings import LEASE_SECONDS

pytestmark = pytest.mark.workers

#: The reaper's period in the project (the default) and the seconds allowed on top.
REAP_INTERVAL_SECONDS = 5
RESUME_BOUND_SECONDS = LEASE_SECONDS + REAP_INTERVAL_SECONDS + 4

#: 144 tasks of 120 ms over 12 keys, one submitted every 20 ms.
TASKS, KEYS, INTERVAL, SECONDS = 144, 12, 0.02, 0.12

RECOMMENDED = {"CELERY_WORKER_PREFETCH_MULTIPLIER": 1, "CELERY_TASK_ACKS_LATE": True}


def wait_for_starts(project, count: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while sum(e["event"] == "start" for e in project.history()) < count:
        assert time.monotonic() < deadline, f"fewer than {count} tasks started in {timeout}s"
        time.sleep(0.05)


def run_through_a_restart(project, server, task: str = "step") -> list[dict]:
    """Two workers, a producer, ``server`` SIGKILLed mid-run and started again 1 s later; then the checks."""
    project.start_workers("a", "b")
    producer = project.produce(task, TASKS, KEYS, INTERVAL, SECONDS)
    wait_for_starts(project, 30)
    server.process.kill()
    server.process.wait()
    time.sleep(1)
    server.start(*AOF_ALWAYS)
    back_at = time.time()

    events = check_run(project, accepted_by(producer))
    assert_workers_survived(project)
    delays = resume_delays(events, back_at)
    assert sorted(delays) == sorted({f"acct:{k}" for k in range(KEYS)}), "every key ran again after the restart"
    assert max(delays.values()) <= RESUME_BOUND_SECONDS, delays
    return events


@pytest.mark.parametrize("celery_settings", [{}, RECOMMENDED], ids=["celery-defaults", "recommended"])
def test_a_redis_killed_and_restarted_mid_run_loses_nothing(make_project, user_redis, celery_settings):
    run_through_a_restart(make_project(**celery_settings), user_redis)


def test_the_broker_s_redis_restarting_beside_a_gate_redis_of_its_own_loses_nothing(make_project, user_redis, workdir):
    with persistent_redis(workdir / "gate-redis") as gate_redis:
        project = make_project(KEYED_QUEUE_REDIS_URL=f"{gate_redis.url}/0")
        run_through_a_restart(project, user_redis)
        project.kill()  # before the gate's Redis stops


def test_connections_cut_by_redis_mid_run_lose_nothing(make_project, user_redis):
    project = make_project()
    project.start_workers("a", "b")
    producer = project.produce("step", TASKS, KEYS, INTERVAL, SECONDS)
    wait_for_starts(project, 30)
    with redis.Redis.from_url(user_redis.url) as admin:
        cut = admin.client_kill_filter(_type="normal", skipme=True) + admin.client_kill_filter(_type="pubsub")
    cut_at = time.time()
    assert cut > 0

    events = check_run(project, accepted_by(producer))
    assert_workers_survived(project)
    delays = resume_delays(events, cut_at)
    assert max(delays.values()) <= RESUME_BOUND_SECONDS, delays


def test_a_pool_keeps_its_limit_through_a_redis_killed_and_restarted_mid_run(make_project, user_redis):
    """Its slots persist with the keys (append-only file): never a fourth run of pool "three", none lost."""
    events = run_through_a_restart(make_project(), user_redis, task="pooled_step")

    assert most_running(events, {e["id"] for e in events}) == 3
