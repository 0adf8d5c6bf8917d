"""``on_failure="block"`` on real workers: a key whose task failed for good runs nothing more until an
operator retries the task (it runs again, first) or cancels it, from ``manage.py``."""

import time

import pytest

from testproject.history_checks import assert_serial
from tests.userproject.run_checks import accepted_by
from tests.waiting import wait_until

pytestmark = pytest.mark.workers

#: Two workers, two keys of five steps each; step 1 of acct:0 fails.
FAILING = {"key": "acct:0", "n": 1}


def blocked_ledger(project) -> tuple[list[dict], dict]:
    """Runs the ledger until acct:0 is blocked by its step 1 and acct:1 ran all its steps."""
    (project.directory / "fail-acct:0-1").touch()
    project.start_workers("a", "b")
    accepted = accepted_by(project.produce("strict_step", 10, 2, 0, 0.05))
    failing = next(a for a in accepted if (a["key"], a["n"]) == (FAILING["key"], FAILING["n"]))
    others = {a["id"] for a in accepted if a["key"] == "acct:1"}

    def ended() -> set[str]:
        return {e["id"] for e in project.history() if e["event"] == "end"}

    wait_until(lambda: others | {failing["id"]} <= ended(), 30, 0.1, "acct:1's steps and acct:0's failure")
    time.sleep(1.5)  # were the key not blocked, its next step would start within milliseconds
    assert starts(project, "acct:0") == [0, 1], "nothing of the blocked key ran after its failure"
    wait_until(lambda: project.rows()[failing["id"]]["status"] == "failed", 10, 0.1, "the failure's record")
    status = project.manage("keyed_queue_status", "--key", "acct:0").stdout
    assert f"blocked by ticket 2: shop.tasks.strict_step[{failing['id']}] failed" in status
    return accepted, failing


def starts(project, key: str) -> list[int]:
    return [e["n"] for e in project.history() if e["event"] == "start" and e["key"] == key]


def wait_for_ledger(project, accepted: list[dict], status: dict[str, str]) -> list[dict]:
    """Every step ended (the failed one as ``status`` says) and was recorded; the history, checked."""
    wanted = {a["id"]: status.get(a["id"], "succeeded") for a in accepted}
    wait_until(lambda: all(project.rows()[i]["status"] == s for i, s in wanted.items()), 30, 0.2, "every record")
    events = project.history()
    assert_serial(events)  # one step of a key at a time, in order
    return events


def test_a_retried_failure_runs_again_first_then_the_rest_in_order(make_project):
    project = make_project()
    accepted, failing = blocked_ledger(project)
    (project.directory / "fail-acct:0-1").unlink()

    retried = project.manage("keyed_queue_retry", failing["id"])
    assert retried.stdout == (
        f"retried task {failing['id']} first on key 'acct:0': it runs again before the key's others\n"
    )
    wait_for_ledger(project, accepted, {})
    assert starts(project, "acct:0") == [0, 1, 1, 2, 3, 4]
    assert project.rows()[failing["id"]]["attempts"] == 2


def test_refused_actions_change_nothing_and_a_cancelled_failure_lets_the_key_move_on(make_project):
    project = make_project()
    accepted, failing = blocked_ledger(project)
    done = next(a for a in accepted if (a["key"], a["n"]) == ("acct:0", 0))
    refusals = {
        ("keyed_queue_retry", done["id"]): f"task {done['id']} succeeded: only a failed task can be retried",
        ("keyed_queue_cancel", done["id"]): f"task {done['id']} succeeded: only a waiting or dispatched task",
        ("keyed_queue_release", "acct:0"): "ticket 2 of key 'acct:0' failed and blocks its key: retry or cancel",
        ("keyed_queue_retry", "no-such-id"): "no keyed task has the id 'no-such-id'",
        ("keyed_queue_release", "acct:1"): "key 'acct:1' has no holder to release",
    }
    for (command, argument), said in refusals.items():
        refused = project.manage(command, argument, check=False)
        assert (refused.returncode, refused.stdout) == (1, ""), command
        assert said in refused.stderr, f"{command} {argument}: {refused.stderr}"
    assert starts(project, "acct:0") == [0, 1], "still blocked"
    assert project.rows()[failing["id"]]["status"] == "failed"

    cancelled = project.manage("keyed_queue_cancel", failing["id"])
    said = f"cancelled task {failing['id']}, which failed and blocked key 'acct:0': the key moves on\n"
    assert cancelled.stdout == said
    wait_for_ledger(project, accepted, {failing["id"]: "cancelled"})
    assert starts(project, "acct:0") == [0, 1, 2, 3, 4]
    assert "step 1 of acct:0 failed" in project.rows()[failing["id"]]["error"], "the failure is kept"
