"""An operator's retry of a failed task, in the user's project with real workers: it works for a task
that failed at once (its message is gone from the gate before its row is written), and repeated or
racing retries of one task run it once."""

import subprocess
import sys

import pytest

from testproject.userproject.project import UserProject
from tests.waiting import wait_until

from .test_integrity import submitted

pytestmark = pytest.mark.workers


def retry_commands(project: UserProject, task_id: str, count: int) -> list[subprocess.CompletedProcess]:
    """``count`` ``keyed_queue_retry task_id`` started at once, in as many terminals."""
    command = [sys.executable, "manage.py", "keyed_queue_retry", task_id]
    running = [
        subprocess.Popen(
            command, cwd=project.directory, env=project.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(count)
    ]
    return [subprocess.CompletedProcess(p.args, p.wait(60), *p.communicate()) for p in running]


def starts_of(project: UserProject, key: str) -> list[str]:
    return [e["id"] for e in project.history() if e["event"] == "start" and e["key"] == key]


def test_a_fast_failure_is_retried_once_however_often_and_however_racing_the_operators_retry(make_project):
    project = make_project()
    (project.directory / "fail-acct:r-1").touch()
    project.worker("a")
    [failed] = submitted(project, "tasks.fallible_step.delay('acct:r', 1)")
    wait_until(lambda: project.rows().get(failed, {}).get("status") == "failed", 30, 0.1, "the failure's record")
    assert project.rows()[failed]["message"], "a failed task keeps what a retry needs"
    (project.directory / "fail-acct:r-1").unlink()

    racing = retry_commands(project, failed, 4)
    won = [done for done in racing if done.returncode == 0]
    assert len(won) == 1, [(d.returncode, d.stdout, d.stderr) for d in racing]
    new_id = won[0].stdout.split(" as task ")[1].split()[0]
    assert won[0].stdout == f"retried task {failed} as task {new_id} at the end of the queue of key 'acct:r'\n"
    later = project.manage("keyed_queue_retry", failed, check=False)
    for refused in [d for d in racing if d.returncode != 0] + [later]:
        assert refused.returncode == 1 and refused.stdout == ""
        assert f"task {failed} was retried already: it runs again as task {new_id}" in refused.stderr

    wait_until(lambda: project.rows().get(new_id, {}).get("status") == "succeeded", 30, 0.1, "the retry's run")
    assert project.rows()[failed]["retried_as"] == new_id and project.rows()[failed]["status"] == "failed"
    assert starts_of(project, "acct:r") == [failed, new_id], "the failure and one retry ran, nothing more"
