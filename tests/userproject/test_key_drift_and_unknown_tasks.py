"""A task that cannot run fails loudly and lets its key move on, in the user's project with real workers:
a key function that is not a function of the arguments as the worker gets them, a retry with arguments of
another key, and a task no worker knows (G3)."""

import json
import time

import pytest

from tests.waiting import wait_until

from .test_integrity import submitted

pytestmark = pytest.mark.workers


def ended(project, task_ids: list[str]) -> dict[str, dict]:
    def rows():
        found = project.rows()
        if all(found.get(t, {}).get("status") in ("succeeded", "failed") for t in task_ids):
            return found
        return None

    return wait_until(rows, 30, 0.1, f"the end of {task_ids}")


def test_a_key_that_drifts_in_the_message_fails_naming_both_keys_and_the_key_moves_on(make_project):
    project = make_project()
    project.worker("a")
    drifting, after = submitted(project, "tasks.pair_step.delay((1, 2), 1), tasks.step.delay('(1, 2)', 2)")
    rows = ended(project, [drifting, after])
    assert rows[drifting]["status"] == "failed" and rows[after]["status"] == "succeeded"
    error = rows[drifting]["error"]
    assert "InvalidKey" in error and "its ticket is of key '(1, 2)'" in error and "make key '[1, 2]'" in error
    assert "a key must be a function of the task's arguments alone" in error
    assert [e["id"] for e in project.history() if e["event"] == "start"] == [after], "the drifted run never ran"


def test_a_retry_with_arguments_of_another_key_fails_where_it_is_made(make_project):
    project = make_project()
    project.worker("a")
    retried, after = submitted(project, "tasks.retried_elsewhere.delay('r', 1), tasks.step.delay('r', 2)")
    rows = ended(project, [retried, after])
    assert rows[retried]["status"] == "failed" and rows[after]["status"] == "succeeded"
    assert (
        "its ticket is of key 'r', but its arguments as the worker has them make key 'r-other'"
        in rows[retried]["error"]
    )
    assert "r-other" not in {e["key"] for e in project.history()}, "no retry was sent"


def submit_unknown_then_known(project, on_failure: str) -> tuple[str, str]:
    """A task registered in the producer only (a release the workers do not run yet), then a known one,
    on key ``g``: their task ids."""
    code = (
        "import json\n"
        "from django_keyed_queue import keyed_serial_task\n"
        "from shop import tasks\n"
        "def ghost(key): pass\n"
        f"ghost = keyed_serial_task(key='{{key}}', name='shop.tasks.ghost', on_failure={on_failure!r})(ghost)\n"
        "print(json.dumps([ghost.delay('g').id, tasks.step.delay('g', 2).id]))"
    )
    ghost, after = json.loads(project.manage("shell", "-c", code).stdout.splitlines()[-1])
    return ghost, after


def test_a_task_no_worker_knows_fails_after_its_recoveries_and_the_key_moves_on(make_project):
    project = make_project(KEYED_QUEUE_REAP_INTERVAL_SECONDS=1)
    project.worker("a")
    ghost, after = submit_unknown_then_known(project, "continue")
    rows = ended(project, [ghost, after])
    assert rows[ghost]["status"] == "failed" and rows[after]["status"] == "succeeded"
    assert "no worker knows task shop.tasks.ghost: its message went out 4 times" in rows[ghost]["error"]


def test_a_task_no_worker_knows_keeps_a_blocking_key_held_until_an_operator_acts(make_project):
    project = make_project(KEYED_QUEUE_REAP_INTERVAL_SECONDS=1)
    project.worker("a")
    ghost, after = submit_unknown_then_known(project, "block")
    wait_until(lambda: project.rows().get(ghost, {}).get("status") == "failed", 30, 0.1, "the unknown task's failure")
    assert "it blocks its key until an operator retries or cancels it" in project.rows()[ghost]["error"]
    assert (
        f"blocked by ticket 1: shop.tasks.ghost[{ghost}] failed"
        in project.manage("keyed_queue_status", "--key", "g").stdout
    )
    time.sleep(1.5)  # were the key not blocked, its next task would start within milliseconds
    assert project.rows()[after]["status"] in ("waiting", "dispatched") and not project.history()
    project.manage("keyed_queue_cancel", ghost)
    assert ended(project, [after])[after]["status"] == "succeeded"
