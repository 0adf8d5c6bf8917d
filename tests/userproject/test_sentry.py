"""A keyed task's failure reported to Sentry, in a project that sets up sentry-sdk as Sentry's Django docs
say (``sentry_sdk.init`` in settings.py; its Celery integration enabled by itself): the event names the
task, as for a plain task, and carries the task's key and attempt as tags."""

import json

import pytest

from tests.userproject.run_checks import accepted_by
from tests.waiting import wait_until

pytestmark = pytest.mark.workers

#: Sentry's set-up, as a project's settings.py has it, with a transport that writes each event to a file
#: (no Sentry server: the events are what the test reads).
SENTRY_SETTINGS = """
import json as _json

import sentry_sdk
from sentry_sdk.transport import Transport


class _EventsToFile(Transport):
    def capture_envelope(self, envelope):
        for item in envelope.items:
            if item.type == "event":
                with open(BASE_DIR / "sentry-events.jsonl", "a") as events:
                    events.write(_json.dumps(item.payload.json) + "\\n")


sentry_sdk.init(dsn="https://public@sentry.example.com/1", transport=_EventsToFile, send_default_pii=False)
"""


def test_a_failure_s_sentry_event_carries_its_key_and_attempt(make_project):
    project = make_project()
    with open(project.directory / "mysite" / "settings.py", "a") as settings:
        settings.write(SENTRY_SETTINGS)
    (project.directory / "fail-sentry:0-0").touch()  # strict_step fails while it is there
    project.worker("a")
    [task] = accepted_by(project.produce("strict_step", 1, 1, 0, 0, prefix="sentry"))

    events_file = project.directory / "sentry-events.jsonl"

    def reported() -> list[dict]:
        return [json.loads(line) for line in events_file.read_text().splitlines()] if events_file.exists() else []

    [event] = wait_until(reported, 30, 0.2, "the failure's Sentry event")
    assert event["exception"]["values"][-1]["value"] == "step 0 of sentry:0 failed"
    assert event["tags"]["celery_task_id"] == task["id"] and event["tags"]["keyed_queue.key"] == "sentry:0"
    assert event["tags"]["keyed_queue.attempt"] == 1
    assert event["transaction"] == "shop.tasks.strict_step", "named by its task, as a plain task's failure is"
