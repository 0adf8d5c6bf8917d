"""keyed_queue_rebuild after the one Redis (broker and gate) lost everything, in a project made as users make
one, with its worker running through the loss and a producer submitting to the old key after it.

The run that was executing at the loss may have ended (here it does, after the loss): it is marked lost and
never run again. The key's tasks that waited at the loss run, in their order, before the task that waits
behind the one submitted since the loss; each task runs once.
"""

import pytest
import redis

from tests.userproject.run_checks import accepted_by
from tests.waiting import wait_until

pytestmark = pytest.mark.workers


def starts(project) -> list[str]:
    return [e["id"] for e in project.history() if e["event"] == "start"]


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_a_rebuild_after_a_total_loss_runs_the_old_tasks_once_before_those_waiting_since(
    make_project, user_redis, database
):
    project = make_project(database)
    project.worker("a")
    running, *waited = accepted_by(project.produce("step", 3, 1, 0, "12,0.1"))
    wait_until(lambda: project.rows().get(running["id"], {}).get("status") == "running", 20, 0.1, "its row running")
    wait_until(lambda: all(project.rows().get(w["id"], {}).get("message") for w in waited), 20, 0.1, "their rows")
    with redis.Redis.from_url(user_redis.url) as admin:
        admin.flushall()  # broker and gate: everything

    since = accepted_by(project.produce("step", 2, 1, 0, "3,0.1"))  # the first runs at once, the second waits
    wait_until(lambda: since[0]["id"] in starts(project), 20, 0.05, "the task submitted since to start")
    rebuilt = project.manage("keyed_queue_rebuild")
    assert f"marked task {running['id']} of key='acct:0' lost" in rebuilt.stdout
    assert "restored 2 tasks of key='acct:0' after its holders, before the tasks submitted since" in rebuilt.stdout

    everyone = [running, *waited, *since]
    wait_until(lambda: {a["id"] for a in everyone} <= project.ended(), 60, 0.2, "every task to end")
    order = starts(project)
    assert sorted(order) == sorted(a["id"] for a in everyone), "each ran once: the run at the loss was not run again"
    assert order == [running["id"], since[0]["id"], waited[0]["id"], waited[1]["id"], since[1]["id"]]
    rows = wait_until(
        lambda: (r := project.rows()) and all(r[a["id"]]["status"] in ("succeeded", "failed") for a in everyone) and r,
        20,
        0.2,
    )
    assert rows[running["id"]]["status"] == "failed" and "lost with the gate's Redis" in rows[running["id"]]["error"]
    assert {rows[a["id"]]["status"] for a in [*waited, *since]} == {"succeeded"}
