"""Django's tasks framework on real Celery workers, in a project made as users make one: ``CeleryBackend``.

The project's ``TASKS`` names the backend; its ``@task`` functions are in ``shop/tasks.py``, where
Celery's ``autodiscover_tasks()`` finds them (testproject/userproject/files/framework_tasks.py). A
client process in the project enqueues them and reads their results (files/tasks_client.py).
"""

import importlib.util
import json
import subprocess
import sys
import time

import pytest
import redis

from testproject.history_checks import assert_serial
from testproject.userproject.project import FILES
from tests.userproject.test_policies import most_at_once
from tests.waiting import wait_until

pytestmark = [
    pytest.mark.workers,
    pytest.mark.skipif(
        importlib.util.find_spec("django.tasks") is None and importlib.util.find_spec("django_tasks") is None,
        reason="Django's tasks framework needs Django 6.0+, or the django-tasks backport on Django 4.2 and 5.2",
    ),
]

TASKS = {"default": {"BACKEND": "django_keyed_queue.tasks_backend.CeleryBackend", "QUEUES": ["default", "other"]}}


class Client:
    """The project's tasks client: one command a line, one answer a line."""

    def __init__(self, project) -> None:
        command = [sys.executable, "tasks_client.py"]
        self.process = subprocess.Popen(
            command, cwd=project.directory, env=project.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def ask(self, **command) -> dict:
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        assert line, "the tasks client died: see its stderr above"
        return json.loads(line)

    def result(self, task: str, task_id: str) -> dict:
        return self.ask(get=task, id=task_id)

    def until(self, task: str, task_id: str, status: str, timeout: float = 30) -> dict:
        return wait_until(
            lambda: (r := self.result(task, task_id)).get("status") == status and r, timeout, 0.05, f"{task} {status}"
        )

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=10)
        self.process.stdout.close()


@pytest.fixture
def project_and_client(make_project, user_redis):
    project = make_project(TASKS=TASKS, CELERY_RESULT_BACKEND=f"{user_redis.url}/1", CELERY_RESULT_EXTENDED=True)
    with open(project.directory / "shop" / "tasks.py", "a") as tasks:
        tasks.write("\n" + (FILES / "framework_tasks.py").read_text())
    (project.directory / "tasks_client.py").write_text((FILES / "tasks_client.py").read_text())
    client = Client(project)
    yield project, client
    client.close()


#: Bad input to ``django_step(key, n, seconds=0.0)``, and the error of ours each raises.
REFUSED = {
    "nan": "InvalidArguments",
    "set": "InvalidArguments",
    "object": "InvalidArguments",
    "int dict key": "InvalidArguments",
    "missing argument": "InvalidArguments",
    "unknown argument": "InvalidArguments",
    "too many": "InvalidArguments",
    "huge message": "InvalidArguments",
    "nul in key": "InvalidKey",
    "empty key": "InvalidKey",
    "key too long": "InvalidKey",
}
#: What a task without a key refuses of the same: its arguments (it has no key, nor a size limit of ours).
REFUSED_PLAIN = ("nan", "set", "object", "int dict key", "missing argument", "unknown argument", "too many")


def test_enqueue_refuses_bad_keys_and_arguments_with_our_errors_and_writes_nothing(project_and_client, user_redis):
    project, client = project_and_client
    for case, error in REFUSED.items():
        reply = client.ask(enqueue_odd="django_step", case=case)
        assert (reply.get("error"), reply.get("module")) == (error, "django_keyed_queue.exceptions"), (case, reply)
        assert "shop.tasks.django_step" in reply["message"] or "step" in reply["message"], reply
    for case in REFUSED_PLAIN:
        reply = client.ask(enqueue_odd="django_plain", case=case)
        assert (reply.get("error"), reply.get("module")) == ("InvalidArguments", "django_keyed_queue.exceptions")
    # The framework's own checks of what .using() sets: Django's error, raised before enqueue.
    for using in ({"queue_name": "nowhere"}, {"priority": 101}):
        reply = client.ask(enqueue="django_step", args=["k", 1], using=using)
        assert reply.get("error") in ("InvalidTask", "InvalidTaskError"), reply

    broker_and_gate = redis.Redis.from_url(f"{user_redis.url}/0")
    assert broker_and_gate.keys("*") == [], "no ticket, no record, no message"
    assert project.rows() == {}, "no row"
    broker_and_gate.close()


def test_using_maps_priority_queue_name_and_run_after_to_celerys_priority_queue_and_eta(project_and_client, user_redis):
    project, client = project_and_client
    before = time.time()
    later = client.ask(
        enqueue="django_step", args=["later", 0], using={"priority": 50, "queue_name": "other", "run_after": 30}
    )
    plain = client.ask(enqueue="django_plain", args=["plain", 0], using={"priority": -100, "queue_name": "other"})
    broker = redis.Redis.from_url(f"{user_redis.url}/0")
    # kombu's Redis transport keeps a queue's messages of each priority step in a list of their own.
    sent = {}
    for name in broker.keys("other*"):
        for raw in broker.lrange(name, 0, -1):
            message = json.loads(raw)
            sent[message["headers"]["id"]] = message
    broker.close()
    assert set(sent) == {later["id"], plain["id"]}, "both on the queue named other"
    # Django's priority, -100 to 100 (higher sooner), on Redis's 0 to 9 (lower sooner).
    assert sent[later["id"]]["properties"]["priority"] == 3
    assert sent[plain["id"]]["properties"]["priority"] == 9
    eta = sent[later["id"]]["headers"]["eta"]
    assert eta is not None and sent[plain["id"]]["headers"]["eta"] is None
    from datetime import datetime

    assert 29 <= datetime.fromisoformat(eta).timestamp() - before <= 40
    # A task due later joins its key's queue when due: it waits, READY, its row written at submission.
    assert client.result("django_step", later["id"])["status"] == "READY"
    assert project.rows()[later["id"]]["status"] == "waiting"


def test_django_tasks_sharing_a_key_run_one_at_a_time_in_order_across_two_workers(project_and_client):
    project, client = project_and_client
    project.start_workers("a", "b")
    keyed = [client.ask(enqueue="django_step", args=[f"acct:{i % 3}", i // 3, 0.2]) for i in range(12)]
    plain = [client.ask(enqueue="django_plain", args=["plain:0", n, 0.2]) for n in range(2)]
    assert all(r["status"] == "READY" and r["enqueued_at"] for r in keyed + plain), keyed + plain

    ids = {r["id"] for r in keyed + plain}
    wait_until(lambda: ids <= {e["id"] for e in project.history() if e["event"] == "end"}, 60, 0.1, "every task")
    events = [e for e in project.history() if e["key"].startswith("acct:")]
    first_starts = assert_serial(events, accepted={f"acct:{k}": [0, 1, 2, 3] for k in range(3)})
    assert first_starts == {f"acct:{k}": [0, 1, 2, 3] for k in range(3)}, "each key's tasks in submission order"
    assert most_at_once(events, {r["id"] for r in keyed}) >= 2, "different keys ran at the same time"
    assert {e["attempt"] for e in events if e["event"] == "start"} == {1}, "the context's attempt"

    for sent in keyed:
        done = client.until("django_step", sent["id"], "SUCCESSFUL")
        key, n, _ = sent["args"]
        assert done["return_value"] == {"key": key, "n": n}
        assert done["attempts"] == 1 and done["errors"] == [] and done["args"] == [key, n, 0.2]
        assert done["enqueued_at"] <= done["started_at"] <= done["finished_at"]
    for sent in plain:
        done = client.until("django_plain", sent["id"], "SUCCESSFUL")  # from Celery's result backend
        assert done["return_value"] == sent["args"][1] and done["finished_at"]
    assert all(project.rows()[r["id"]]["status"] == "succeeded" for r in keyed)
    assert not {r["id"] for r in plain} & set(project.rows()), "a task without a key has no keyed task row"


def test_get_result_reads_ready_running_successful_and_failed_with_times_errors_and_value(project_and_client):
    project, client = project_and_client
    project.worker("a")
    held = client.ask(enqueue="django_held", args=["hold", 0])
    running = client.until("django_held", held["id"], "RUNNING")
    assert running["started_at"] and running["finished_at"] is None and running["attempts"] == 1
    assert running["return_value_error"] == "Task has not finished yet"
    behind = client.ask(enqueue="django_step", args=["hold", 1])
    wait_until(lambda: project.rows().get(behind["id"], {}).get("status") == "waiting", 10, 0.05, "its row")
    waiting = client.result("django_step", behind["id"])
    assert waiting["status"] == "READY" and waiting["started_at"] is None, "waiting for its key reads READY"

    failing = client.ask(enqueue="django_failing", args=["fails", 0])
    failed = client.until("django_failing", failing["id"], "FAILED")
    [(path, traceback, class_name)] = failed["errors"]
    assert (path, class_name) == ("shop.tasks.Declined", "Declined")
    assert "step 0 of fails declined" in traceback
    assert failed["return_value_error"] == "Task failed" and failed["finished_at"] >= failed["started_at"]

    (project.directory / "release-hold").touch()
    released = client.until("django_held", held["id"], "SUCCESSFUL")
    assert released["return_value"] == "released"
    after = client.until("django_step", behind["id"], "SUCCESSFUL")
    assert after["started_at"] >= released["finished_at"], "the key's next task started after the first ended"
    assert client.ask(aget="django_step", id=behind["id"]) == after

    assert client.result("django_step", "no-such-task")["error"] == "TaskResultDoesNotExist"
    assert client.result("django_step", held["id"])["error"] == "TaskResultMismatch", "another task's id"
