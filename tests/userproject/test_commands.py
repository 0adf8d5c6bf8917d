"""Operator commands run from the project's ``manage.py``, where Celery has imported no task module.

Each one that publishes a stored message must really publish it (by name), and
say so only when the broker took it.
"""

import base64
import json
import pickle
import time

import pytest
import redis

from tests.userproject.run_checks import accepted_by, check_run
from tests.waiting import wait_until

pytestmark = pytest.mark.workers


def test_resume_dispatches_what_waits(make_project):
    project = make_project()
    project.worker("a")
    paused = project.manage("keyed_queue_pause", "acct:0")
    assert (paused.stdout, paused.stderr) == ("paused 'acct:0'\n", ""), "said once"
    accepted = accepted_by(project.produce("step", 3, 1, 0, 0.05))
    time.sleep(0.5)
    assert project.history() == [], "a paused key dispatches nothing"

    resumed = project.manage("keyed_queue_resume", "acct:0")
    assert resumed.stdout.strip() == "resumed 'acct:0': 1 dispatched"
    check_run(project, accepted, timeout=15)


def test_a_refused_publish_is_reported_and_published_again(make_project, user_redis):
    project = make_project()
    project.worker("a")
    project.manage("keyed_queue_pause", "acct:0")
    accepted = accepted_by(project.produce("step", 2, 1, 0, 0.05))
    with redis.Redis.from_url(user_redis.url) as admin:
        admin.execute_command("ACL", "SETUSER", "default", "-lpush")  # the broker refuses every publish
        try:
            resumed = project.manage("keyed_queue_resume", "acct:0", check=False)
        finally:
            admin.execute_command("ACL", "SETUSER", "default", "+lpush")
    assert resumed.returncode == 1
    assert "0 of 1 dispatched; the broker refused 1" in resumed.stderr
    assert "dispatched" not in resumed.stdout
    check_run(project, accepted, timeout=20)  # the worker's reaper publishes it again


def test_reap_publishes_a_lost_message_again(make_project, user_redis):
    project = make_project(KEYED_QUEUE_WORKER_REAPER=False, KEYED_QUEUE_DISPATCH_TIMEOUT_SECONDS=2)
    accepted = accepted_by(project.produce("step", 2, 1, 0, 0.05))
    with redis.Redis.from_url(f"{user_redis.url}/0") as broker:
        assert broker.delete("celery") == 1, "the granted task's message is lost before any worker reads it"
    project.worker("a")
    time.sleep(2.5)  # past the dispatch timeout

    reaped = project.manage("keyed_queue_reap")
    assert "republish key='acct:0' ticket=1" in reaped.stdout
    check_run(project, accepted, timeout=15)


def test_rebuild_after_redis_lost_everything(make_project, user_redis):
    project = make_project()
    accepted = accepted_by(project.produce("step", 6, 2, 0, 0.05))
    # No worker runs to write the rows within KEYED_QUEUE_RECORD_FLUSH_SECONDS: the status command does.
    assert "active tasks: dispatched 2, waiting 4" in project.manage("keyed_queue_status").stdout
    with redis.Redis.from_url(user_redis.url) as admin:
        admin.flushall()

    rebuilt = project.manage("keyed_queue_rebuild")
    assert rebuilt.stdout.splitlines() == [
        "restored 3 tasks of key='acct:0'",
        "restored 3 tasks of key='acct:1'",
        "restored 6 tasks over 2 keys; 0 running at the loss marked lost; 0 keys held back by one; "
        "0 tasks the gate still keeps left as they are; 0 tasks without a stored message of their own",
    ]
    assert rebuilt.stderr == ""
    project.worker("a")
    check_run(project, accepted, timeout=20)


class CreatesAFile:
    """Unpickling it creates a file (``open(path, "w")``): proof that something decoded it."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_resume_never_unpickles_a_parked_message_rewritten_in_redis(make_project, user_redis, tmp_path):
    # Both copies the gate keeps of ticket 1 are rewritten: its stored message, and the broker message
    # the gate pushes when it grants it (one Redis: messaging/wire.py). The push reaches a worker,
    # which refuses it (accept_content); the reaper then publishes the stored one, which the
    # dispatcher refuses: the task fails and its key moves on.
    project = make_project(KEYED_QUEUE_DISPATCH_TIMEOUT_SECONDS=2)
    project.worker("a")
    project.manage("keyed_queue_pause", "acct:0")
    first, second = accepted_by(project.produce("step", 2, 1, 0, 0.05))
    pickled = pickle.dumps({"args": [], "kwargs": {}, "options": {}, "x": CreatesAFile(str(tmp_path / "ran"))})
    forged = {"task": "shop.tasks.step", "id": first["id"], "content_type": "application/x-python-serialize"}
    forged.update(encoding="binary", body=base64.b64encode(pickled).decode())
    header = {"key": "acct:0", "ticket": 1, "dispatch": 1}
    pushed = {
        "body": base64.b64encode(pickle.dumps(([CreatesAFile(str(tmp_path / "ran"))], {}, {}))).decode(),
        "content-encoding": "binary",
        "content-type": "application/x-python-serialize",
        "headers": {"lang": "py", "task": "shop.tasks.step", "id": first["id"], "keyed_queue": header},
        "properties": {
            "body_encoding": "base64", "delivery_tag": "forged", "priority": 0,
            "delivery_info": {"exchange": "", "routing_key": "celery"},
        },
    }  # fmt: skip
    with redis.Redis.from_url(f"{user_redis.url}/0") as gate:
        assert gate.hexists("keyed_queue:{acct:0}:wires", 1), "one Redis: the gate keeps the broker message"
        gate.hset("keyed_queue:{acct:0}:messages", 1, json.dumps(forged))
        gate.hset(
            "keyed_queue:{acct:0}:wires", 1, "\0".join(["w1", "", "celery", "", "", "\x06\x16", json.dumps(pushed)])
        )

    project.manage("keyed_queue_resume", "acct:0")
    check_run(project, [second], timeout=30)  # the key moved on to the next task
    assert not (tmp_path / "ran").exists(), "the payload was never unpickled"
    row = project.rows()[first["id"]]
    assert row["status"] == "failed" and "not in accept_content" in row["error"]


def test_status_of_a_task_says_what_holds_it_with_real_workers(make_project):
    project = make_project()
    project.worker("a")
    accepted = accepted_by(project.produce("step", 3, 1, 0, "8,0.1"))  # the holder runs while the commands look
    holder, _, last = (a["id"] for a in accepted)
    wait_until(lambda: any(e["event"] == "start" for e in project.history()), 20, 0.1, "the first task to start")
    project.manage("keyed_queue_pause", "acct:0")

    def told() -> str:
        out = project.manage("keyed_queue_status", "--task", last).stdout
        return out if f"[{holder}] holds the key: running for" in out and " on a@" in out else ""

    said = wait_until(told, 10, 0.2, "the status to name the running holder and its worker")
    assert said.splitlines()[0] == f"shop.tasks.step[{last}] key 'acct:0': waiting"
    assert "  - its key is paused by " in said and "(manage.py keyed_queue_pause) since " in said
    assert said.rstrip().endswith("1 task of the key waits ahead of it")
    data = json.loads(project.manage("keyed_queue_status", "--task", last, "--json").stdout)
    assert (data["waiting_ahead"], data["paused"], data["holders"][0]["task_id"]) == (1, True, holder)
    project.manage("keyed_queue_resume", "acct:0")
    check_run(project, accepted, timeout=40)
    assert "it succeeded at " in project.manage("keyed_queue_status", "--task", last).stdout
