"""The Prometheus metrics view: the deployment's totals from the gate's Redis, gauges from the records and
the gate, labels that never carry a key, and fields that are not ours left out (who may read them:
test_metrics_access.py)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.test import override_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from django_keyed_queue.gate.keys import TOTALS, TOTALS_TEMPLATES
from django_keyed_queue.process import totals
from django_keyed_queue.process.state import current, get_gate
from django_keyed_queue.records.columns import TASK_NAME_MAX_LENGTH
from testproject.demo.tasks import step
from tests.django.queues import QUEUE
from tests.gate_redis import ON_CLUSTER

pytestmark = pytest.mark.django_db
URL = "/keyed-queue/metrics/"
DOCS = Path(__file__).parents[2] / "docs"


@pytest.fixture
def fresh_totals(gate_redis):
    """What earlier tests counted in this process is added, then the totals start from nothing."""
    current().totals.flush()
    gate_redis.delete(TOTALS, TOTALS_TEMPLATES)
    yield
    current().totals.flush()


def scrape(client) -> dict[str, list]:
    """Every sample of a scrape, by sample name: [(labels, value)]."""
    response = client.get(URL)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    samples: dict[str, list] = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return samples


def value(samples, name, **labels) -> float:
    matching = [v for found, v in samples.get(name, []) if all(found.get(k) == w for k, w in labels.items())]
    assert len(matching) == 1, (name, labels, samples.get(name))
    return matching[0]


def test_submissions_waiting_tasks_and_a_paused_key_read_as_counted(viewer_client, gate_redis, broker, fresh_totals):
    get_gate().pause("held")
    for n in range(3):
        step.apply_async(("held", n), queue=QUEUE)
    for n in range(4):
        step.apply_async((f"free-{n}", n), queue=QUEUE)
    current().totals.flush()
    samples = scrape(viewer_client)
    labels = {"task": step.name, "key_template": "{key}"}
    assert value(samples, "keyed_queue_submitted_total", **labels) == 7
    assert value(samples, "keyed_queue_tasks_waiting", **labels) == 3
    assert value(samples, "keyed_queue_tasks_running", **labels) == 4  # dispatched: each holds its key
    assert value(samples, "keyed_queue_keys_paused") == 1
    assert value(samples, "keyed_queue_keys_active") == 5
    assert value(samples, "keyed_queue_gate_up") == 1
    assert value(samples, "keyed_queue_oldest_wait_seconds") >= 0
    keys = {"held", *(f"free-{n}" for n in range(4))}
    label_values = {v for series in samples.values() for found, _ in series for v in found.values()}
    assert not keys & label_values, "no label value is a key"


def test_another_process_s_counts_are_in_this_process_s_scrape(viewer_client, gate_redis, broker, fresh_totals):
    from django.conf import settings as django_settings

    gate = {"KEYED_QUEUE_REDIS_URL": django_settings.KEYED_QUEUE_REDIS_URL, "KEYED_QUEUE_REDIS_CLUSTER": ON_CLUSTER}
    code = (
        "import django; django.setup()\n"
        "from django.conf import settings\n"
        f"for name, value in {gate!r}.items(): setattr(settings, name, value)\n"
        "from testproject.demo.tasks import step\n"
        f"for n in range(5): step.apply_async(('other', n), queue={QUEUE!r})\n"
    )
    environment = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    # It exits at once: what it counted is added as it exits.
    subprocess.run([sys.executable, "-c", code], env=environment, check=True, timeout=60, capture_output=True)
    assert value(scrape(viewer_client), "keyed_queue_submitted_total", task=step.name) == 5


def test_an_unreachable_redis_reads_gate_down_and_the_records_gauges_still_answer(viewer_client):
    with override_settings(KEYED_QUEUE_REDIS_URL="redis://127.0.0.1:1/0"):
        current().reset_gate()
        try:
            samples = scrape(viewer_client)
        finally:
            current().reset_gate()
    assert value(samples, "keyed_queue_gate_up") == 0
    assert value(samples, "keyed_queue_keys_active") == 0


def test_histograms_are_cumulative_with_their_sum_and_count(viewer_client, gate_redis, fresh_totals):
    counted = current().totals
    for seconds in (0.001, 0.2, 0.2, 7.0, 99999.0):
        counted.observe("run_seconds", step, seconds, outcome="succeeded")
    counted.flush()
    samples = scrape(viewer_client)
    labels = {"task": step.name, "key_template": "{key}", "outcome": "succeeded"}
    assert value(samples, "keyed_queue_run_seconds_bucket", le="0.005", **labels) == 1
    assert value(samples, "keyed_queue_run_seconds_bucket", le="0.25", **labels) == 3
    assert value(samples, "keyed_queue_run_seconds_bucket", le="10.0", **labels) == 4
    assert value(samples, "keyed_queue_run_seconds_bucket", le="3600.0", **labels) == 4
    assert value(samples, "keyed_queue_run_seconds_bucket", le="+Inf", **labels) == 5
    assert value(samples, "keyed_queue_run_seconds_count", **labels) == 5
    assert value(samples, "keyed_queue_run_seconds_sum", **labels) == pytest.approx(0.001 + 0.4 + 7.0 + 99999.0)


def test_fields_that_are_not_ours_are_left_out_and_the_rest_is_served(viewer_client, gate_redis, fresh_totals):
    gate_redis.hset(
        TOTALS,
        mapping={
            "not json": 1,
            json.dumps(["submitted", "t"]): 1,  # too few labels
            json.dumps(["no_such_series", "t", "", ""]): 1,
            json.dumps(["submitted", 7, "", ""]): 1,  # a label that is not text
            totals.field("submitted", "ours"): "not a number",
            totals.field("started", "ours"): 3,
        },
    )
    samples = scrape(viewer_client)
    assert value(samples, "keyed_queue_started_total", task="ours") == 3
    assert [labels for labels, n in samples.get("keyed_queue_submitted_total", []) if n] == [], "only zeros"
    assert "t" not in {labels["task"] for labels, _ in samples["keyed_queue_submitted_total"]}


def test_the_top_keys_gauge_is_opt_in_and_capped(viewer_client, gate_redis, broker, fresh_totals):
    for n in range(3):
        step.apply_async(("busy", n), queue=QUEUE)
        step.apply_async(("other-busy", n), queue=QUEUE)
    assert "keyed_queue_key_oldest_wait_seconds" not in scrape(viewer_client)
    with override_settings(KEYED_QUEUE_METRICS_TOP_KEYS=1):
        listed = scrape(viewer_client)["keyed_queue_key_oldest_wait_seconds"]
    assert [labels["key"] for labels, _ in listed] == ["busy"], "the key waiting longest, and only one"
    with override_settings(KEYED_QUEUE_METRICS_TOP_KEYS=10**9):
        assert len(scrape(viewer_client)["keyed_queue_key_oldest_wait_seconds"]) == 2  # capped, not an error


task_names = st.text(st.characters(codec="utf-8"), max_size=300) | st.sampled_from(["", "\x00", "a\nb", '"}{\\'])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=task_names, template=task_names, seconds=st.floats(min_value=-1e9, max_value=1e12))
def test_any_task_name_and_template_make_the_scrape_that_names_them(viewer_client, gate_redis, name, template, seconds):
    gate_redis.delete(TOTALS, TOTALS_TEMPLATES)
    kept = name[:TASK_NAME_MAX_LENGTH]  # as a record keeps it (a name over 200 characters failed here once)
    assert totals.parse_field(totals.field("finished", name, "failed")) == ("finished", kept, "failed", "")
    counted = totals.Totals(get_gate)
    counted.count("finished", name, outcome="failed", n=2)
    counted.observe("wait_seconds", name, seconds)
    counted.flush()
    gate_redis.hset(TOTALS_TEMPLATES, kept, template)
    samples = scrape(viewer_client)
    assert value(samples, "keyed_queue_finished_total", task=kept, outcome="failed") == 2
    assert value(samples, "keyed_queue_finished_total", task=kept, outcome="succeeded") == 0, "exported from zero"
    assert value(samples, "keyed_queue_wait_seconds_count", task=kept, key_template=template) == 1
    assert value(samples, "keyed_queue_wait_seconds_sum", task=kept) == pytest.approx(max(0.0, seconds))


def test_every_counter_of_a_registered_task_is_exported_from_zero(viewer_client, gate_redis, fresh_totals):
    """A series born at its first count is one increase() never sees rise: one fenced end would not fire the
    docs' alert. Each registered keyed task's counters are there at 0 before anything counts them."""
    samples = scrape(viewer_client)
    for series in totals.COUNTERS:
        outcomes = {"finished": ("succeeded", "failed"), "recovered": ("redispatch", "fail")}.get(series, (None,))
        for outcome in outcomes:
            labels = {"task": step.name, "key_template": "{key}", **({"outcome": outcome} if outcome else {})}
            assert value(samples, f"keyed_queue_{series}_total", **labels) == 0, (series, outcome)
    current().totals.count("fenced", step)
    current().totals.flush()
    assert value(scrape(viewer_client), "keyed_queue_fenced_total", task=step.name) == 1, "the first count, seen"


def test_the_docs_list_every_series_and_the_dashboard_reads_no_other(viewer_client, gate_redis, broker, fresh_totals):
    counted = current().totals
    for series in totals.COUNTERS:
        counted.count(series, step, outcome="succeeded" if series in ("finished", "recovered") else "")
    for series in totals.HISTOGRAMS:
        counted.observe(series, step, 1.0, outcome="succeeded" if series == "run_seconds" else "")
    counted.flush()
    step.apply_async(("busy", 0), queue=QUEUE)
    step.apply_async(("busy", 1), queue=QUEUE)
    with override_settings(KEYED_QUEUE_METRICS_TOP_KEYS=1):
        response = viewer_client.get(URL)
    served = {family.name for family in text_string_to_metric_families(response.content.decode())}

    page = (DOCS / "metrics.md").read_text()
    listed = page[page.index("## Every series") : page.index("## Alerts")]
    documented = {name.removesuffix("_total") for name in re.findall(r"^\| `(keyed_queue_\w+)`", listed, re.MULTILINE)}
    assert served == documented

    dashboard = (DOCS / "grafana-dashboard.json").read_text()
    json.loads(dashboard)
    read = {re.sub(r"_(total|bucket|count|sum)$", "", name) for name in re.findall(r"keyed_queue_\w+", dashboard)}
    assert read <= served and len(read) >= 10


def test_without_prometheus_client_the_view_names_the_extra_to_install(monkeypatch):
    from django.core.exceptions import ImproperlyConfigured

    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # as if it were not installed
    monkeypatch.delitem(sys.modules, "django_keyed_queue.ops.console.metrics")
    with pytest.raises(ImproperlyConfigured, match=r"pip install 'django-keyed-queue\[metrics\]'"):
        from django_keyed_queue import metrics  # noqa: F401
