"""Celery's task features on keyed tasks in the user's project: Celery's defaults (prefetch 4, early
acknowledgement), one Redis for broker, gate and results, SQLite.

Each behaviour runs on a key held by another task, so that its tasks wait in the gate and most run
by local handoff. The second test runs the features that changed Celery's message or its ending of a
run on plain tasks and their keyed twins side by side; the compatibility tier (tests/compat) checks
many more that way in the testproject.
"""

import json

import celery
import pytest

from testproject.history_checks import assert_serial
from tests.waiting import wait_until

pytestmark = pytest.mark.workers

#: Run in ``manage.py shell``: each behaviour, with what Celery gives for it on a plain task.
SCRIPT = """
import json
from kombu.exceptions import EncodeError
from celery import chord
from shop.tasks import rejected_step, replaced_step, retried_step, step, total

key = "features"
seen = {}
step.delay(key, 0, 0.5)  # holds the key while the rest is submitted
revoked = step.delay(key, 50)  # would run by local handoff in the process that ran 0
revoked.revoke()
seen["revoke"] = [step.delay(key, 51).get(timeout=30), revoked.state]
seen["starmap"] = step.starmap([(key, n, 0.1) for n in (1, 2, 3)]).delay().get(timeout=30)
seen["chunks"] = step.chunks([(key, n, 0.2) for n in (4, 5, 6, 7)], 2).apply_async().get(timeout=30)
seen["replace"] = replaced_step.delay(key, 8).get(timeout=30)
seen["reject"] = rejected_step.delay(key, 9).get(timeout=30)
ignored = step.apply_async((key, 10, 0.2), ignore_result=True)
seen["ignored"] = [ignored.ignored, ignored.get(timeout=1)]
seen["chain"] = (step.si(key, 11) | step.si(key, 12)).delay().get(timeout=30)
seen["chord"] = chord([step.si(key, 13), step.si(key, 14)])(total.s(key=key)).get(timeout=30)
seen["retry"] = retried_step.delay(key, 15).get(timeout=30)
try:
    step.delay(key, object())
except EncodeError as exc:
    seen["encode"] = type(exc).__name__
print(json.dumps(seen))
"""


def test_canvas_retries_replace_reject_revoke_and_results_behave_as_celery_s(make_project, user_redis):
    project = make_project(CELERY_RESULT_BACKEND=f"{user_redis.url}/1")
    project.start_workers("a", "b")
    seen = json.loads(project.manage("shell", "-c", SCRIPT).stdout.splitlines()[-1])
    assert seen == {
        "starmap": [1, 2, 3],
        "chunks": [[4, 5], [6, 7]],
        "replace": 108,  # the replacement's result
        "reject": 9,  # its second delivery ran
        "ignored": [True, None],
        "revoke": [51, "REVOKED"],
        "chain": 12,
        "chord": 27,
        "retry": 15,  # the next task ran; the revoked one did not
        "encode": "UnencodableArguments",
    }
    numbers = [0, 51, 1, 2, 3, 4, 5, 6, 7, 108, 9, 10, 11, 12, 13, 14, 1027, 15]

    def ended():
        events = project.history()
        return events if {e["n"] for e in events if e["event"] == "end"} == set(numbers) else None

    events = wait_until(ended, 15, 0.1, "every task to end")
    starts = [e["n"] for e in events if e["event"] == "start"]
    assert sorted(starts) == sorted(numbers), "each ran once (the rejected delivery did not start, nor 50)"
    assert_serial(events, accepted={"features": starts})  # one at a time
    assert starts[:9] == [0, 51, *range(1, 8)], "the key's tasks started in the order they were submitted"


#: Each behaviour on a plain task and on its keyed twin (the keyed one's key held by another task), in
#: ``manage.py shell``: what a user sees of each, by kind.
SIDE_BY_SIDE = """
import json, os, time
from celery import group
from celery.canvas import StampingVisitor
from celery.exceptions import TaskRevokedError
from kombu.exceptions import EncodeError
from django.conf import settings
from mysite.celery import app
from django_keyed_queue.records.models import KeyedTask
from shop import tasks


class Monitor(StampingVisitor):
    def __init__(self, monitoring_id):
        self.monitoring_id = monitoring_id

    def on_signature(self, sig, **headers):
        return {"monitoring_id": self.monitoring_id}


def started(task_id, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        history = settings.BASE_DIR / "history.jsonl"
        if history.exists() and f'"id": "{task_id}"' in history.read_text():
            return
        time.sleep(0.05)
    raise AssertionError(f"{task_id} did not start")


def state_of(result):
    try:
        return result.get(timeout=20)
    except TaskRevokedError:
        return result.state


seen, ids = {}, {}
for kind in ("plain", "keyed"):
    fields, step = getattr(tasks, f"{kind}_fields"), tasks.step if kind == "keyed" else tasks.plain_step
    key, out, hold = f"side-{kind}", seen.setdefault(kind, {}), 0.5 if kind == "keyed" else 0
    wait = {} if kind == "keyed" else {"countdown": 2}  # a plain task waits for its countdown instead

    step.delay(key, 0, hold)
    canvas = group(fields.s(key, n, ["stamped_headers", "stamps"]) for n in (1, 2))
    canvas.stamp(visitor=Monitor("m1"))
    out["stamps"] = canvas.apply_async().get(timeout=20)

    step.delay(key, 3, 1.0 if kind == "keyed" else 0)
    stamped = fields.si(key, 4, []).set(**wait)
    stamped.stamp(visitor=Monitor(f"m2-{kind}"))
    waiting = stamped.apply_async()
    app.control.revoke_by_stamped_headers({"monitoring_id": f"m2-{kind}"}, reply=True, limit=2, timeout=5)
    out["revoke_by_stamped_headers"] = state_of(waiting)

    shown = fields.apply_async((key, 5, ["argsrepr", "kwargsrepr"]), argsrepr="(<hidden>)", kwargsrepr="{}")
    out["argsrepr"] = shown.get(timeout=20)
    if kind == "keyed":
        for _ in range(100):
            row = KeyedTask.objects.filter(task_id=shown.id, status="succeeded").first()
            if row is not None:
                break
            time.sleep(0.1)
        out["record"] = row.arguments

    step.delay(key, 6, hold)
    try:
        out["pydantic"] = getattr(tasks, f"{kind}_greet").delay(tasks.Person(name="Ann"), key=key).get(timeout=20)
    except EncodeError:  # Celery before 5.5 sends the model as it is
        out["pydantic"] = "EncodeError"

    step.delay(key, 7, hold)
    untyped = getattr(tasks, f"{kind}_untyped").delay(key, 1)  # y is missing: Celery does not check
    error = untyped.get(timeout=20, propagate=False)
    out["typing=False"] = [untyped.state, type(error).__name__]

    step.delay(key, 8, 2.0 if kind == "keyed" else 0)  # still busy when the delayed task is due
    delayed = fields.apply_async((key, 9, ["published_by"]), countdown=1)
    out["delayed"] = delayed.get(timeout=20)["published_by"] == os.getpid()
    ids[f"{kind}-delayed"] = delayed.id

    holder = step.delay(key, 10, 0.3)
    started(holder.id)
    running = step.delay(key, 11, 8.0)  # keyed: runs by local handoff in the process that ran 10
    started(running.id)
    running.revoke(terminate=True)
    out["terminate"] = [holder.get(timeout=20), state_of(running), step.delay(key, 12).get(timeout=30)]
    ids[f"{kind}-terminated"] = running.id
print(json.dumps({"seen": seen, "ids": ids}))
"""


def test_celery_s_features_behave_on_a_keyed_task_as_on_its_plain_twin(make_project, user_redis):
    """Stamping, revoke by stamped headers, argsrepr, pydantic, typing=False, a delayed task's message
    and revoke(terminate=True) of a task that waited for its key (run by local handoff)."""
    project = make_project(CELERY_RESULT_BACKEND=f"{user_redis.url}/1")
    project.start_workers("a", "b")
    out = json.loads(project.manage("shell", "-c", SIDE_BY_SIDE).stdout.splitlines()[-1])
    plain, keyed = out["seen"]["plain"], out["seen"]["keyed"]
    record = keyed.pop("record")
    assert plain == keyed
    assert keyed == {
        "stamps": [{"stamped_headers": ["monitoring_id"], "stamps": {"monitoring_id": "m1"}}] * 2,
        "revoke_by_stamped_headers": "REVOKED",
        "argsrepr": {"argsrepr": "(<hidden>)", "kwargsrepr": "{}"},
        "pydantic": {"text": "hello Ann"} if celery.VERSION >= (5, 7) else plain["pydantic"],
        "typing=False": ["FAILURE", "TypeError"],
        "delayed": True,
        "terminate": [10, "REVOKED", 12],
    }
    assert record == "args=(<hidden>) kwargs={}", "the record shows argsrepr and kwargsrepr, not the arguments"
    published = [json.loads(line) for line in (project.directory / "published.jsonl").read_text().splitlines()]
    for kind in ("plain", "keyed"):
        assert len([p for p in published if p["id"] == out["ids"][f"{kind}-delayed"]]) == 1, "published once"
    log = "".join(worker.log() for worker in project.workers)
    assert f"Terminating {out['ids']['keyed-terminated']} (15), run by local handoff" in log
    events = project.history()
    for kind in ("plain", "keyed"):
        killed = [e["event"] for e in events if e["id"] == out["ids"][f"{kind}-terminated"]]
        assert killed == ["start"], f"{kind}: the terminated task was killed mid-run"
    # The terminated run never ended: its process was killed before its key moved on.
    keyed_events = [e for e in events if e["key"] == "side-keyed" and e["id"] != out["ids"]["keyed-terminated"]]
    assert_serial(keyed_events, accepted={"side-keyed": [e["n"] for e in keyed_events if e["event"] == "start"]})
