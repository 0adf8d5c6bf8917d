"""Acceptance: many keys, random durations, two prefork workers; order and exclusion from the history."""

import random
import threading
from collections import defaultdict

import pytest

from testproject.demo.history import read as read_history
from testproject.demo.tasks import step
from testproject.history_checks import assert_serial
from tests.waiting import wait_for_records

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.workers]


def most_running_at_once(events) -> int:
    running, most = 0, 0
    for e in events:
        running += 1 if e["event"] == "start" else -1
        most = max(most, running)
    return most


def test_many_keys_random_durations(workers, gate_redis):
    rng = random.Random(2026)
    counters: dict[str, int] = defaultdict(int)
    submitted = []
    for _ in range(300):
        key = f"acct-{rng.randrange(30)}"
        submitted.append(step.delay(key, counters[key], rng.uniform(0, 0.03)))
        counters[key] += 1
    records = wait_for_records(r.id for r in submitted)
    assert {r.status for r in records.values()} == {"succeeded"}
    events = read_history()
    starts = assert_serial(events)
    assert {k: len(v) for k, v in starts.items()} == dict(counters)
    assert len(events) == 600, "every task ran exactly once"
    assert most_running_at_once(events) >= 3, "tasks of different keys must run concurrently"
    for key, count in counters.items():
        tickets = sorted(r.ticket for r in records.values() if r.key == key)
        assert tickets == list(range(1, count + 1))


def test_concurrent_producers_keep_the_gates_order(workers, gate_redis):
    """Three threads submit to the same keys at once: tasks start in the order the gate took them."""
    keys = [f"shared-{i}" for i in range(5)]
    ids: dict[tuple[str, int], str] = {}
    lock = threading.Lock()

    def produce(offset: int) -> None:
        rng = random.Random(offset)
        for i in range(40):
            key, n = keys[rng.randrange(len(keys))], offset * 1000 + i
            result = step.delay(key, n, rng.uniform(0, 0.01))
            with lock:
                ids[(key, n)] = result.id

    threads = [threading.Thread(target=produce, args=(t,)) for t in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    records = wait_for_records(ids.values())
    accepted = defaultdict(list)
    for (key, n), _ in sorted(ids.items(), key=lambda item: records[item[1]].ticket):
        accepted[key].append(n)
    starts = assert_serial(read_history(), accepted=accepted)
    assert starts == accepted
