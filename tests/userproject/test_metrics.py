"""The metrics in a user's project: totals summed over every process, scraped from a process that ran none
with the bearer token Prometheus sends (and refused without it)."""

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.userproject.run_checks import accepted_by, check_run
from tests.waiting import wait_until

pytestmark = pytest.mark.workers

#: The project's KEYED_QUEUE_METRICS_TOKEN.
TOKEN = "kq-metrics-0f3b9a7c5e1d"

#: What a process that submitted nothing and ran nothing serves: the view mounted as docs/metrics.md says,
#: asked as Prometheus' ``authorization`` scrape config asks, and without it.
SCRAPE = rf"""
from django.test import Client
client = Client(SERVER_NAME="localhost")
refused = client.get("/keyed-queue/metrics/")
assert refused.status_code == 401 and refused["WWW-Authenticate"].startswith("Bearer"), refused.status_code
response = client.get("/keyed-queue/metrics/", HTTP_AUTHORIZATION="Bearer {TOKEN}")
assert response.status_code == 200, response.status_code
print("# scrape\n" + response.content.decode())
"""


#: The view mounted as docs/metrics.md says.
MOUNTED = """
from django_keyed_queue import metrics

urlpatterns += [path("keyed-queue/metrics/", metrics)]
"""


def scrape(project) -> dict[str, list]:
    samples: dict[str, list] = {}
    printed = project.manage("shell", "-c", SCRAPE).stdout  # Django 5.2's shell may say what it imported first
    for family in text_string_to_metric_families(printed[printed.index("# scrape\n") :]):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return samples


def total(samples, name, **labels) -> float:
    return sum(v for found, v in samples.get(name, []) if all(found.get(k) == w for k, w in labels.items()))


def test_fifty_run_and_three_parked_on_a_paused_key_read_as_such_from_a_process_that_ran_none(make_project):
    project = make_project(KEYED_QUEUE_METRICS_TOKEN=TOKEN)
    with open(project.directory / "mysite" / "urls.py", "a") as urls:
        urls.write(MOUNTED)
    project.manage("keyed_queue_pause", "held:0")
    parked = accepted_by(project.produce("step", 3, 1, 0, 0.0, prefix="held"))
    project.start_workers("a", "b")
    ran = accepted_by(project.produce("step", 50, 10, 0, 0.0, prefix="acct"))
    check_run(project, ran)

    step = {"task": "shop.tasks.step", "key_template": "{key}"}

    def counted():
        samples = scrape(project)
        return total(samples, "keyed_queue_finished_total", outcome="succeeded", **step) == 50 and samples

    samples = wait_until(counted, 30, 0.5, "the workers' counts to reach the totals")
    assert total(samples, "keyed_queue_submitted_total", **step) == 53
    assert total(samples, "keyed_queue_started_total", **step) == 50
    assert total(samples, "keyed_queue_tasks_waiting", **step) == 3
    assert total(samples, "keyed_queue_tasks_running", **step) == 0
    assert total(samples, "keyed_queue_keys_paused") == 1
    assert total(samples, "keyed_queue_keys_active") == 1
    assert total(samples, "keyed_queue_wait_seconds_count", **step) == 50
    assert total(samples, "keyed_queue_run_seconds_count", outcome="succeeded", **step) == 50
    assert total(samples, "keyed_queue_gate_up") == 1

    keys = {a["key"] for a in ran + parked}
    label_values = {v for series in samples.values() for found, _ in series for v in found.values()}
    assert keys and not keys & label_values, "no label value is a key"

    # Workers restarted: what they counted stays, and the new ones add to it.
    for worker in project.workers:
        worker.stop()
    project.worker("c")
    check_run(project, ran + accepted_by(project.produce("step", 5, 5, 0, 0.0, prefix="after")))

    def recounted():
        samples = scrape(project)
        return total(samples, "keyed_queue_finished_total", outcome="succeeded", **step) == 55 and samples

    samples = wait_until(recounted, 30, 0.5, "the new worker's counts added to the old ones'")
    assert total(samples, "keyed_queue_submitted_total", **step) == 58
