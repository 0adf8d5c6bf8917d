"""Django's idioms in the user's project: enqueue on commit with real workers, and the user's own test
suite in eager mode."""

import json

import pytest
import redis

from tests.waiting import wait_until

pytestmark = pytest.mark.workers

#: Run in ``manage.py shell``: transactions that enqueue keyed tasks on commit.
SCRIPT = """
import json, threading
from django.db import connection, transaction
from shop.models import Order
from shop.tasks import order_seen, step

ids = {}
enqueued, committed = threading.Event(), threading.Event()


def enqueue_then_commit_late():
    try:
        with transaction.atomic():
            ids["late"] = step.delay_on_commit("commit", 1).id
            enqueued.set()
            committed.wait(10)
    finally:
        connection.close()


late = threading.Thread(target=enqueue_then_commit_late)
late.start()
enqueued.wait(10)
with transaction.atomic():
    ids["early"] = step.delay_on_commit("commit", 2).id
committed.set()
late.join(10)

try:
    with transaction.atomic():
        order = Order.objects.create(name="rolled back")
        ids["rolled_back"] = order_seen.delay_on_commit("rollback", 3, order.pk).id
        raise RuntimeError("roll back")
except RuntimeError:
    pass

with transaction.atomic():
    order = Order.objects.create(name="committed")
    ids["seen"] = order_seen.delay_on_commit("orders", 4, order.pk).id
print(json.dumps(ids))
"""


def test_delay_on_commit_runs_tasks_of_a_key_in_commit_order_and_a_rollback_leaves_nothing(make_project, user_redis):
    project = make_project()
    project.worker("a")
    ids = json.loads(project.manage("shell", "-c", SCRIPT).stdout.splitlines()[-1])

    def ended():
        events = project.history()
        return events if len([e for e in events if e["event"] == "end"]) == 3 else None

    events = wait_until(ended, 30, 0.1, "the three committed tasks to end")
    starts = [(e["key"], e["n"]) for e in events if e["event"] == "start"]
    assert [n for key, n in starts if key == "commit"] == [2, 1], "commit order, not call order"
    assert ("rollback", 3) not in starts
    seen = next(e for e in events if e["event"] == "start" and e["key"] == "orders")
    assert seen["seen"] is True, "the task saw the row its transaction wrote"

    def recorded():
        rows = project.rows()
        return rows if len(rows) == 3 else None

    rows = wait_until(recorded, 10, 0.1, "three records")
    assert ids["rolled_back"] not in rows and ids["early"] in rows and ids["late"] in rows
    gate = redis.Redis.from_url(f"{user_redis.url}/0")
    try:
        assert not any(b"rollback" in name for name in gate.scan_iter()), "no ticket of the rolled back task"
    finally:
        gate.close()


def test_the_user_s_test_suite_in_eager_mode_catches_a_bad_key(make_project):
    project = make_project(CELERY_TASK_ALWAYS_EAGER=True)
    done = project.manage("test", "shop", "--verbosity", "2", check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "test_a_bad_key_fails_at_the_call" in output and "Ran 4 tests" in output
