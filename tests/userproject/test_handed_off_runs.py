"""A run handed off locally is a run Celery knows, in a project made as users make one (Celery's defaults:
early acknowledgement, no result backend; one Redis; SQLite; real prefork workers).

A child process that finishes a task runs its key's next task itself, inside the finished task's pool
job, so Celery's main process still counts that job as the finished task's. A revoke with ``terminate``
of the finished task (or an operator's Stop racing its end) once killed the next task, which then ran
again after its lease; revoking several waiting tasks withdrew only the first (the loop stopped on the
missing result backend), and the others ran by local handoff.
"""

import json
import re

import pytest

from tests.userproject.run_checks import accepted_by
from tests.waiting import wait_until

pytestmark = pytest.mark.workers


def events(project, task_id: str, event: str) -> list[dict]:
    return [e for e in project.history() if e["event"] == event and e["id"] == task_id]


def shell(project, code: str) -> dict:
    out = project.manage("shell", "-c", f"import json, time\nfrom mysite.celery import app\n{code}").stdout
    return json.loads(out.splitlines()[-1])


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_a_revoke_with_terminate_of_a_task_that_ended_leaves_the_run_it_handed_off_alone(make_project, database):
    project = make_project(database)
    project.worker("a", concurrency=1)
    first, second = accepted_by(project.produce("step", 2, 1, 0, "0.3,8"))
    [start] = wait_until(lambda: events(project, second["id"], "start"), timeout=30)
    assert events(project, first["id"], "end"), "the second runs after the first"

    seen = shell(
        project,
        # limit=1: the one worker's reply ends the wait, so the revoke goes out while the second runs.
        f"active = app.control.inspect(timeout=5, limit=1).active()\n"
        f"app.control.revoke({first['id']!r}, terminate=True)\n"
        "print(json.dumps({'active': active, 'revoked_at': time.time()}))",
    )
    active, revoked_at = seen["active"], seen["revoked_at"]
    [running] = [r for runs in active.values() for r in runs]
    # Celery's inspect shows the run executing, not the task whose job hosts it.
    assert (running["id"], running["hosted_by"], running["worker_pid"]) == (second["id"], first["id"], start["pid"])
    assert running["name"] == "shop.tasks.step" and running["time_start"] >= start["t"] - 1

    [end] = wait_until(lambda: events(project, second["id"], "end"), timeout=30, message="the handed-off run to end")
    assert revoked_at < end["t"], "the revoke was sent while the second ran"
    assert len(events(project, second["id"], "start")) == 1, "it was not killed, and did not run again"
    rows = wait_until(
        lambda: (r := project.rows()).get(second["id"], {}).get("status") == "succeeded" and r, timeout=20
    )
    assert rows[second["id"]]["attempts"] == 1 and rows[first["id"]]["status"] == "succeeded"
    assert "has ended: not terminated" in project.workers[0].log()
    stats = shell(project, "print(json.dumps(app.control.inspect(timeout=5, limit=1).stats()))")
    [total] = [reply["total"] for reply in stats.values()]
    assert total == {"shop.tasks.step": 2}, "Celery's stats count the run handed off too"


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_revoking_several_waiting_tasks_withdraws_each_with_no_result_backend(make_project, database):
    project = make_project(database)
    project.worker("a", concurrency=1)
    holder, *waiting, last = accepted_by(project.produce("step", 5, 1, 0, "4,0.1"))
    wait_until(lambda: events(project, holder["id"], "start"), timeout=30)

    revoked = [w["id"] for w in waiting]
    shell(project, f"app.control.revoke({revoked!r})\nprint('{{}}')")

    wait_until(lambda: events(project, last["id"], "end"), timeout=30, message="the key's last task to run")
    assert not [e for e in project.history() if e["id"] in revoked], "a revoked waiting task ran"
    rows = wait_until(
        lambda: (r := project.rows()) and all(r.get(i, {}).get("status") == "cancelled" for i in revoked) and r,
        timeout=20,
    )
    assert {rows[i]["error"] for i in revoked} == {"cancelled by Celery: it was revoked"}
    assert "NotImplementedError" not in project.workers[0].log()


#: Run in ``manage.py shell``: task events switched on remotely (as Flower does), every event captured while
#: a (0.3 s) and then b (4 s) of one key run on a worker started without -E, then c (0.3 s, failing) and d
#: (4 s) of another; the events, as JSON.
EVENTS_SCRIPT = """
import json, threading, time, uuid
from mysite.celery import app
from django.conf import settings
from shop.tasks import fallible_step, step

captured = []
connection = app.connection_for_read()
receiver = app.events.Receiver(connection, handlers={"*": lambda e: captured.append(dict(e, seen=time.time()))})
threading.Thread(target=lambda: receiver.capture(limit=None, timeout=None, wakeup=False), daemon=True).start()
probe = uuid.uuid4().hex
with app.events.default_dispatcher(hostname="probe") as dispatcher:
    while not any(e.get("uuid") == probe for e in captured):
        dispatcher.send("probe", uuid=probe)
        time.sleep(0.2)
app.control.enable_events()
time.sleep(1)
(settings.BASE_DIR / "fail-events-f-1").touch()
a, b = step.delay("events", 1, 0.3), step.delay("events", 2, 4)
c, d = fallible_step.delay("events-f", 1, 0.3), step.delay("events-f", 2, 4)
ids = [t.id for t in (a, b, c, d)]
deadline = time.monotonic() + 40
ended = lambda: {b.id, d.id} <= {e.get("uuid") for e in captured if e["type"] == "task-succeeded"}
while time.monotonic() < deadline and not ended():
    time.sleep(0.1)
receiver.should_stop = True
print(json.dumps({"a": a.id, "b": b.id, "c": c.id, "d": d.id, "events": [
    {"type": e["type"], "uuid": e.get("uuid"), "seen": e["seen"]} for e in captured if e.get("uuid") in ids
]}))
"""


def test_task_events_switched_on_remotely_reach_a_handed_off_run_and_a_task_s_end_is_told_when_it_ends(
    make_project,
):
    project = make_project()
    project.worker("a", concurrency=1)  # Celery's docs' command: no -E
    out = project.manage("shell", "-c", EVENTS_SCRIPT).stdout.splitlines()[-1]
    seen = json.loads(out)
    a, b = seen["a"], seen["b"]
    kinds = {(e["uuid"], e["type"]) for e in seen["events"]}
    assert {(b, "task-started"), (b, "task-succeeded")} <= kinds, "the handed-off run sent its events"
    [a_end] = events(project, a, "end")
    [b_start] = events(project, b, "start")
    [a_told] = [e["seen"] for e in seen["events"] if e["uuid"] == a and e["type"] == "task-succeeded"]
    received = re.findall(r"/MainProcess\] Task [\w.]+\[([0-9a-f-]{36})\] received", project.workers[0].log())
    assert b not in received and a in received, "b ran by local handoff in a's job, not by a message"
    assert a_told - a_end["t"] < 2, "a's end was told when a ended, not 4 s later with b's"
    c, d = seen["c"], seen["d"]
    assert {(d, "task-started"), (d, "task-succeeded")} <= kinds and d not in received, "d ran by local handoff"
    [c_end] = events(project, c, "end")
    [c_told] = [e["seen"] for e in seen["events"] if e["uuid"] == c and e["type"] == "task-failed"]
    assert c_told - c_end["t"] < 2, "c's failure was told when c failed, not 4 s later with d's, and once"
    assert [e["type"] for e in seen["events"] if e["uuid"] in (a, c)].count("task-succeeded") == 1
