"""Celery's task features on keyed tasks in the user's project: Celery's defaults (prefetch 4, early
acknowledgement), one Redis for broker, gate and results, SQLite.

Each behaviour runs on a key held by another task, so that its tasks wait in the gate and most run
by local handoff; the compatibility tier (tests/compat) checks many more on plain tasks and keyed
twins side by side.
"""

import json

import pytest

from tests.helpers import check_history, wait_until

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
    project.worker("a")
    project.worker("b")
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
    check_history(events, accepted={"features": starts})  # one at a time
    assert starts[:9] == [0, 51, *range(1, 8)], "the key's tasks started in the order they were submitted"
