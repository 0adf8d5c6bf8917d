"""A Redis with persistence restarts mid-run: no accepted submission is lost, order holds."""

import json
import os
import subprocess
import sys
import time

import pytest
import redis

from testproject.demo.history import HISTORY
from testproject.history_checks import assert_serial
from testproject.servers import AOF_ALWAYS, ROOT, persistent_redis
from tests.chaos.timings import timing_env
from tests.waiting import wait_for_records

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.workers]


@pytest.fixture
def restartable_redis(tmp_path):
    with persistent_redis(tmp_path / "redis") as server:
        yield server


def test_redis_restart_mid_run_loses_nothing(chaos, restartable_redis):
    # Workers and the producer run on this Redis (gate and broker); the test reads the records.
    env = {"TESTPROJECT_REDIS_URL": restartable_redis.url}
    chaos.start(2, env=env)
    producer = subprocess.Popen(
        [sys.executable, "-m", "tests.chaos.produce", chaos.queue, "60", "6", "0.05"],
        cwd=ROOT,
        env={**os.environ, **env, **timing_env(), "DJANGO_SETTINGS_MODULE": "testproject.settings"},
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(1.2)
    restartable_redis.stop()
    time.sleep(0.5)
    restartable_redis.start(*AOF_ALWAYS)
    out, _ = producer.communicate(timeout=120)
    assert producer.returncode == 0
    accepted = [json.loads(line) for line in out.splitlines()]
    assert len(accepted) == 60

    records = wait_for_records((a["id"] for a in accepted), timeout=90)
    failed = {r.key: (r.ticket, r.attempts, r.error) for r in records.values() if r.status != "succeeded"}
    assert not failed
    history = redis.Redis.from_url(f"{restartable_redis.url}/3")
    events = [json.loads(raw) for raw in history.lrange(HISTORY, 0, -1)]
    by_ticket = sorted(accepted, key=lambda a: (a["key"], records[a["id"]].ticket))
    order = {}
    for a in by_ticket:
        order.setdefault(a["key"], []).append(a["n"])
    starts = assert_serial(events, accepted=order)
    assert starts == order, "every accepted task ran, in the gate's order"
