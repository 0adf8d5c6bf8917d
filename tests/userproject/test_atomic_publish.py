"""One Redis for the broker and the gate (the README's install): the grant and the broker message are one step.

A producer killed with SIGKILL right after the gate granted its task leaves
the task's message on Celery's queue: a worker runs it at once, not after the
dispatch timeout (300 s by default), and its record is written.
"""

import json
import signal
import sys
import uuid

from tests.userproject.run_checks import check_run

#: Run in the project's directory: submit one task, and die by SIGKILL the moment the gate's call returns.
DIES_AFTER_THE_GRANT = """
import json, os, signal, sys
import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")
django.setup()
from django_keyed_queue.producer import submit
from shop.tasks import step

take_ticket = submit.take_ticket


def take_then_die(*args, **kwargs):
    taken = take_ticket(*args, **kwargs)
    print(json.dumps({"granted": taken.granted, "pushed": taken.pushed}), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


submit.take_ticket = take_then_die
step.apply_async(("acct:0", 0, 0), task_id=sys.argv[1])
"""


def test_a_producer_killed_right_after_its_grant_leaves_its_task_in_the_broker(make_project):
    project = make_project()  # the dispatch timeout as users have it: 300 s
    worker = project.worker("a")  # connected before: no reconnect republishes anything
    (project.directory / "dies_after_the_grant.py").write_text(DIES_AFTER_THE_GRANT)
    task_id = str(uuid.uuid4())

    died = project.run([sys.executable, "dies_after_the_grant.py", task_id], check=False)
    assert died.returncode == -signal.SIGKILL, died.stderr
    assert json.loads(died.stdout) == {"granted": True, "pushed": True}
    check_run(project, [{"key": "acct:0", "n": 0, "id": task_id}], timeout=20)
    assert "the gate pushes each granted task's message onto Celery's queue" in worker.log_path.read_text()
