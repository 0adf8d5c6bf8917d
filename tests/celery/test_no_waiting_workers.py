"""G5: tasks behind a busy key wait in Redis, not in worker slots."""

import time

import pytest
import redis
from django.conf import settings

from django_keyed_queue.gate.keys import KeyNames
from testproject.demo.history import read as read_history
from testproject.demo.tasks import step
from tests.waiting import wait_for_records

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.workers]


def test_busy_key_does_not_take_worker_slots(workers, gate_redis):
    holder = step.delay("hot", 0, 4.0)
    parked = [step.delay("hot", n) for n in range(1, 101)]
    assert gate_redis.llen(KeyNames("hot").queue) == 100
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    assert broker.llen("celery") <= 1, "parked tasks must not be in the broker"

    began = time.monotonic()
    others = [step.delay(f"cold-{i}", i, 0.01) for i in range(40)]
    wait_for_records([r.id for r in others], timeout=30)
    elapsed = time.monotonic() - began
    events = read_history()
    # The hot key's first task (4 s) may not have ended yet: then it counts as ending after all.
    hot_end = next((i for i, e in enumerate(events) if e["key"] == "hot" and e["event"] == "end"), len(events))
    cold_ends = [i for i, e in enumerate(events) if e["key"].startswith("cold-") and e["event"] == "end"]
    assert len(cold_ends) == 40
    assert max(cold_ends) < hot_end, "other keys must finish while the hot key is still held"
    assert elapsed < 4.0
    wait_for_records([holder.id, *(r.id for r in parked)], timeout=60)
