"""Revokes, terminates and Stops at random moments of random runs, on real prefork workers whose runs hand
off locally, in a project made as users make one (Celery's defaults, no result backend): a hypothesis
state machine of the worker side, beside the gate's model test (tests/gate/test_model.py).

Its rules submit tasks of random lengths on two keys and, between waits of random lengths, act on random
tasks (waiting, running by message or by local handoff, finishing, or ended) through one driver process
of the project: Celery's ``revoke``, ``revoke(terminate=True)`` and the operator's Stop (``ops.stop.stop``,
which every surface calls). The model is each key's queue in submission order, with each action's time.
What must hold, from the tasks' own starts and ends (their pids and times) and the actions' own times:

- no task starts twice, and every run that did not end was one a terminate or a Stop named, after it
  started: nothing else is killed (a revoke or Stop of a task that ended changes nothing);
- a key's tasks start in submission order, each after the run before it ended or was killed: never beside it;
- a task revoked a second before it would start never starts (by message or by local handoff);
- every task's record ends, in one attempt, and one that never started is cancelled.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from tests.waiting import wait_until

pytestmark = pytest.mark.workers

#: The driver: one line of JSON in (an action), one out (its time, a task id, a refusal), in the project.
DRIVER = """
import json, sys, time
from mysite.celery import app
from shop.tasks import step
from django_keyed_queue.exceptions import ActionRefused
from django_keyed_queue.ops.actions.stop import stop

print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    action = json.loads(line)
    kind, done = action["kind"], {"t": time.time()}
    if kind == "submit":
        done["id"] = step.delay(action["key"], action["n"], action["seconds"]).id
    elif kind == "revoke":
        app.control.revoke(action["id"])
    elif kind == "terminate":
        app.control.revoke(action["id"], terminate=True, signal="SIGKILL")
    else:
        try:
            stop(action["id"], by="chaos", signal="SIGKILL")
        except ActionRefused as refused:
            done["refused"] = str(refused)
    print(json.dumps(done), flush=True)
"""

ENDED = ("succeeded", "failed", "cancelled")
KINDS = st.sampled_from(["revoke", "terminate", "stop"])
MAX_TASKS = 10


class Driver:
    def __init__(self, project) -> None:
        command = [sys.executable, "manage.py", "shell", "-c", DRIVER]
        self.process = subprocess.Popen(
            command, cwd=project.directory, env=project.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        try:
            assert self.answer() == {"ready": True}, "the driver did not start"
        except BaseException:
            self.close()
            raise

    def answer(self) -> dict:
        """The next line of JSON it prints (Django's shell may print a line of its own first)."""
        for line in self.process.stdout:
            if line.startswith("{"):
                return json.loads(line)
        raise AssertionError(f"the driver exited {self.process.wait(10)}")

    def __call__(self, **action) -> dict:
        self.process.stdin.write(json.dumps(action) + "\n")
        self.process.stdin.flush()
        return self.answer()

    def close(self) -> None:
        self.process.stdin.close()
        try:
            self.process.wait(30)
        finally:
            self.process.kill()
            self.process.wait()
            self.process.stdout.close()


class RunsUnderRevokesAndStops(RuleBasedStateMachine):
    """One example: keys of its own on the test's project and worker, and the model of their queues."""

    project = None
    driver: Driver
    examples = itertools.count()

    def __init__(self) -> None:
        super().__init__()
        self.prefix = f"chaos{next(self.examples)}"
        self.submitted: list[dict] = []  # {"id", "key", "t"} in submission order
        self.actions: list[dict] = []  # {"kind", "id", "t"}

    tasks = Bundle("tasks")

    @precondition(lambda self: len(self.submitted) < MAX_TASKS)
    @rule(target=tasks, key=st.sampled_from([0, 1]), seconds=st.sampled_from([0.2, 1.0, 2.5]))
    def submit(self, key, seconds):
        key = f"{self.prefix}:{key}"
        done = self.driver(kind="submit", key=key, n=len(self.submitted), seconds=seconds)
        self.submitted.append({"id": done["id"], "key": key, "t": done["t"]})
        return done["id"]

    @rule(task=tasks, kind=KINDS)
    def act(self, task, kind):
        done = self.driver(kind=kind, id=task)
        self.actions.append({"kind": "stop refused" if "refused" in done else kind, "id": task, "t": done["t"]})

    @precondition(lambda self: self.running())
    @rule(data=st.data(), kind=KINDS)
    def act_on_a_running_one(self, data, kind):
        """As a chosen task is most often waiting or ended: one whose body has started and not ended."""
        self.act(data.draw(st.sampled_from(self.running())), kind)

    @precondition(lambda self: self.not_started())
    @rule(data=st.data(), kind=KINDS)
    def act_on_one_not_started(self, data, kind):
        self.act(data.draw(st.sampled_from(self.not_started())), kind)

    def running(self) -> list[str]:
        events = {(e["id"], e["event"]) for e in self.history()}
        return [s["id"] for s in self.submitted if (s["id"], "start") in events and (s["id"], "end") not in events]

    def not_started(self) -> list[str]:
        started = {e["id"] for e in self.history()}
        return [s["id"] for s in self.submitted if s["id"] not in started]

    @rule(seconds=st.sampled_from([0.05, 0.3, 0.8]))
    def wait(self, seconds):
        time.sleep(seconds)

    def history(self) -> list[dict]:
        ids = {s["id"] for s in self.submitted}
        return [e for e in self.project.history() if e["id"] in ids]

    @invariant()
    def no_task_started_twice(self):
        started = [e["id"] for e in self.history() if e["event"] == "start"]
        assert len(started) == len(set(started)), "a task started twice"

    def teardown(self):
        ids = [s["id"] for s in self.submitted]
        if not ids:
            return

        def settled():
            rows = self.project.rows()
            return rows if all(rows.get(i, {}).get("status") in ENDED for i in ids) else None

        try:
            rows = wait_until(settled, 60, 0.2, "every task's record to end")
        except AssertionError as timed_out:
            rows, history = self.project.rows(), self.history()
            unended = {
                i: (rows.get(i), [e for e in history if e["id"] == i])
                for i in ids
                if i not in rows or rows[i].get("status") not in ENDED
            }
            raise AssertionError(
                f"{timed_out}: not ended {unended}; actions {self.actions}; submitted {self.submitted}"
            ) from None
        history = self.history()
        starts = {e["id"]: e for e in history if e["event"] == "start"}
        ends = {e["id"]: e for e in history if e["event"] == "end"}
        assert len(starts) == len([e for e in history if e["event"] == "start"]), "a task started twice"

        killers = [a for a in self.actions if a["kind"] in ("terminate", "stop")]
        freed_at = {}  # a run's end, or the first kill sent after it started
        for task_id, start in starts.items():
            if task_id in ends:
                freed_at[task_id] = ends[task_id]["t"]
                continue
            named = [a for a in killers if a["id"] == task_id and a["t"] >= start["t"] - 0.05]
            assert named, f"{task_id} was killed without a terminate or Stop naming it after it started: {self.actions}"
            freed_at[task_id] = named[0]["t"]

        for key in {s["key"] for s in self.submitted}:
            ran = [s["id"] for s in self.submitted if s["key"] == key and s["id"] in starts]
            assert ran == sorted(ran, key=lambda i: starts[i]["t"]), f"{key}'s tasks started out of order"
            for before, after in itertools.pairwise(ran):
                assert starts[after]["t"] >= freed_at[before] - 0.05, f"{after} started beside {before}"

        for action in (a for a in self.actions if a["kind"] == "revoke"):
            start = starts.get(action["id"])
            assert start is None or start["t"] < action["t"] + 1.0, f"a task revoked before it started ran: {action}"

        for task_id in ids:
            row = rows[task_id]
            assert row["attempts"] <= 1, f"{task_id} ran {row['attempts']} attempts"
            if task_id not in starts:
                assert row["status"] == "cancelled", f"{task_id} never started yet is {row['status']}"


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_random_revokes_and_stops_kill_only_the_runs_they_name(make_project, database):
    project = make_project(database)
    project.worker("a")
    driver = Driver(project)
    RunsUnderRevokesAndStops.project, RunsUnderRevokesAndStops.driver = project, driver
    try:
        run_state_machine_as_test(
            RunsUnderRevokesAndStops,
            settings=settings(max_examples=4, stateful_step_count=20, deadline=None, derandomize=True, database=None),
        )
    finally:
        driver.close()
