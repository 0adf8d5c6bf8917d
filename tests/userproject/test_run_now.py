"""Run now, on real prefork workers in a project made as users make one: a task waiting for its key's rate
or its debounce starts within seconds, once, and the copy that waited never runs it again."""

import json
import time

import pytest

from tests.userproject.run_checks import accepted_by
from tests.waiting import wait_until

pytestmark = pytest.mark.workers


def starts(project, task_id: str) -> list[dict]:
    return [e for e in project.history() if e["event"] == "start" and e["id"] == task_id]


def reasons(project, task_id: str) -> list[str]:
    return json.loads(project.manage("keyed_queue_status", "--task", task_id, "--json").stdout)["reasons"]


def test_a_task_waiting_for_its_keys_rate_and_a_debounced_one_run_now_once(make_project):
    project = make_project()
    project.worker("a")
    first, second = accepted_by(project.produce("hourly_step", 2, 1, 0, 0))
    [debounced] = accepted_by(project.produce("slow_debounced_step", 1, 1, 0, 0, prefix="doc"))
    wait_until(lambda: starts(project, first["id"]), timeout=20)
    told = wait_until(lambda: [r for r in reasons(project, second["id"]) if "its key's rate is 2/h" in r], timeout=20)
    assert told[0].startswith("it starts at "), "the rate's wait is said first"
    assert any("debounced" in r for r in reasons(project, debounced["id"]))

    for waiting in (second, debounced):
        said = project.manage("keyed_queue_run_now", waiting["id"]).stdout
        assert "published again to start now (dispatch 2)" in said

    wait_until(lambda: starts(project, second["id"]) and starts(project, debounced["id"]), timeout=20)
    refused = project.manage("keyed_queue_run_now", second["id"], check=False)
    assert refused.returncode == 1, "run now once"
    # The copies that waited are held by the worker until their eta, when the gate drops them (an older
    # dispatch: tests/gate/test_run_now.py); nothing runs twice meanwhile.
    time.sleep(3)
    assert [len(starts(project, t["id"])) for t in (first, second, debounced)] == [1, 1, 1]
