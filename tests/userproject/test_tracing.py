"""OpenTelemetry on a real prefork worker, its producer untraced: a task run by local handoff carries its
own message's trace context, or none, never the span of the task whose job it runs in.

The worker is traced as OpenTelemetry's Celery instrumentation documents it (testproject/userproject/
files/tracing.py, which writes each span ended to ``spans.jsonl``). One key's tasks are submitted back to
back, so that each after the first runs by local handoff; one of them carries a ``traceparent`` of its own,
as a traced producer's message would.
"""

from __future__ import annotations

import json
import shutil

import pytest

from testproject.userproject.project import FILES, UserProject
from tests.userproject.run_checks import check_run
from tests.waiting import wait_until

pytestmark = pytest.mark.workers

TRACE_ID, PARENT_ID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


def traced(project: UserProject) -> UserProject:
    shutil.copy(FILES / "tracing.py", project.directory / "mysite" / "tracing.py")
    with open(project.directory / "mysite" / "celery.py", "a") as celery_module:
        celery_module.write("\nfrom . import tracing  # noqa: E402,F401\n")
    return project


def run_spans(project: UserProject, task_ids: list[str]) -> dict[str, dict]:
    """Each task's run span (``run/<task>``), by task id, once all are ended."""

    def ended():
        path = project.directory / "spans.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        spans = [json.loads(line) for line in lines]
        runs = {s["task_id"]: s for s in spans if s["name"].startswith("run/") and s["task_id"] in task_ids}
        return runs if len(runs) == len(task_ids) else None

    return wait_until(ended, 20, 0.2, "every run's span")


def test_a_task_run_by_local_handoff_carries_its_own_trace_context_or_none(make_project):
    project = traced(make_project(KEYED_QUEUE_LOCAL_HANDOFF_SECONDS=5))  # the key's chain runs on in one job
    project.worker("a")
    calls = [
        "tasks.handoff_step.delay('t', 0, 0.5)",  # holds the key while the others are submitted
        "tasks.handoff_step.delay('t', 1)",
        f"tasks.handoff_step.apply_async(('t', 2), headers={{'traceparent': {TRACEPARENT!r}}})",
        "tasks.handoff_step.delay('t', 3)",
    ]
    code = f"import json; from shop import tasks; print(json.dumps([r.id for r in ({', '.join(calls)},)]))"
    ids = json.loads(project.manage("shell", "-c", code).stdout.splitlines()[-1])
    check_run(project, [{"key": "t", "n": n, "id": task_id} for n, task_id in enumerate(ids)], timeout=30)

    handed_off = {e["id"] for e in project.history() if e["event"] == "start" and e["handed_off"]}
    assert handed_off >= set(ids[1:]), "each task after the first ran by local handoff"
    spans = run_spans(project, ids)
    first, second, own, last = (spans[task_id] for task_id in ids)
    assert first["parent_id"] is None, "an untraced producer's message starts a trace"
    for span in (second, last):
        assert span["parent_id"] is None and span["trace_id"] != first["trace_id"], (
            f"a run by local handoff of a message with no trace context is a root, not a child of the run "
            f"before it: {span} after {first}"
        )
    assert (own["parent_trace_id"], own["parent_id"]) == (TRACE_ID, PARENT_ID), own
    assert own["trace_id"] == TRACE_ID
