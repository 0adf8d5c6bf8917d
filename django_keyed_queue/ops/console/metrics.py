"""Prometheus metrics a project can mount: ``path("keyed-queue/metrics/", metrics)``.

Counters and histograms are the deployment's totals, which every process adds to in the gate's
Redis (``process/totals.py``): a scrape of any one process sees every worker's and producer's,
and a worker's restart loses nothing it had added. Gauges are read at each scrape from the
records and the gate. Labels are the task's name, its key template and an outcome; a key's
value is never one, unless ``KEYED_QUEUE_METRICS_TOP_KEYS`` asks for the few keys waiting longest.
Every series is listed in docs/metrics.md.

Who may read them: a logged-in staff user who may view keyed tasks (what the task list asks, which
these keys and counts are a view of), a request with ``KEYED_QUEUE_METRICS_TOKEN`` as its bearer token
(Prometheus' ``authorization`` scrape config), or anyone with ``KEYED_QUEUE_METRICS_PUBLIC``.
"""

from __future__ import annotations

import hashlib
import logging
from collections import defaultdict
from collections.abc import Iterable, Iterator
from functools import cache
from hmac import compare_digest

from celery import current_app
from django.contrib.admin.views.decorators import staff_member_required
from django.core.exceptions import ImproperlyConfigured
from django.db.models import Count, Min
from django.http import HttpRequest, HttpResponse, HttpResponseForbidden

try:
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
except ImportError as exc:  # pragma: no cover - exercised in a process without the extra
    raise ImproperlyConfigured(
        "django_keyed_queue's metrics view needs prometheus-client: pip install 'django-keyed-queue[metrics]'"
    ) from exc

from ...conf import MAX_TOP_KEYS, settings
from ...gate.views import ConsoleGate
from ...process import totals
from ...process.state import console_gate
from ...records import submissions
from ...records.manager import seconds_since
from ...records.models import KeyedTask
from ...records.statuses import Status
from .live import pool_states, stuck_after_seconds, unrenewed_runs
from .permissions import may_view_tasks

logger = logging.getLogger(__name__)

#: Most keys a scrape checks for a block, or counts overdue (the gauges say "at least" past it).
MAX_KEYS_READ = 10_000

COUNTER_HELP = {
    "submitted": "Tasks submitted (each call that took a ticket, or sent a delayed task).",
    "started": "Runs started (every attempt, by message or by local handoff).",
    "finished": "Runs and tasks ended, by outcome: a run's end, an operator's cancel, a replacement.",
    "recovered": "The reaper's recoveries, by what it did (outcome): redispatch, republish, grant, fail, block.",
    "fenced": "Ends refused because the attempt no longer held its key (its lease was lost and recovered).",
    "handed_over": "Tasks run by local handoff, in the process that ran their key's previous task.",
    "refused": "Messages a worker dropped at start: a duplicate, or not the ticket's own.",
}
HISTOGRAM_HELP = {
    "wait_seconds": "Time from a task's submission (or its eta) to its first start: the wait for its key.",
    "run_seconds": "Time a run held its key, by how it ended (outcome).",
}
#: The series that carry an ``outcome`` label.
WITH_OUTCOME = frozenset({"finished", "recovered", "run_seconds"})
#: The outcomes a counter of each task is exported with from zero (others appear at their first count):
#: a series born at its first count is one ``increase()`` and ``rate()`` never see rise.
OUTCOMES_FROM_ZERO = {
    "finished": (Status.SUCCEEDED, Status.FAILED),
    "recovered": ("redispatch", "republish", "fail", "block"),
}
#: Statuses the ``running`` gauge counts: the task holds one of its key's slots.
HOLDING = (Status.DISPATCHED, Status.RUNNING, Status.RETRYING)


#: What a 401 asks for (RFC 6750): a bearer token, for the keyed queue's metrics.
CHALLENGE = 'Bearer realm="keyed_queue metrics"'


def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus' text format, for a staff user who may view keyed tasks, a request with
    ``KEYED_QUEUE_METRICS_TOKEN`` as its bearer token, or anyone with ``KEYED_QUEUE_METRICS_PUBLIC``.

    A staff user without that permission gets 403. Anyone else gets 401 asking for the token when
    one is set (a scraper is told, not sent to a login page), else the admin's login page.
    """
    if settings.METRICS_PUBLIC:
        return _scrape(request)
    token, offered = _token(), _bearer(request)
    if token is not None and offered is not None and _same(offered, token):
        return _scrape(request)
    user = getattr(request, "user", None)  # a token alone needs no authentication middleware
    if user is not None and user.is_active and user.is_staff:
        if may_view_tasks(user):
            return _scrape(request)
        return HttpResponseForbidden(
            "You may not view keyed tasks, nor their metrics.\n", content_type="text/plain; charset=utf-8"
        )
    if token is None:
        return staff_member_required(_scrape)(request)  # to the admin's login page, as before there were tokens
    refused = HttpResponse(
        "The keyed queue's metrics need a bearer token (Authorization: Bearer <token>) or a staff login.\n",
        status=401,
        content_type="text/plain; charset=utf-8",
    )
    refused["WWW-Authenticate"] = CHALLENGE if offered is None else f'{CHALLENGE}, error="invalid_token"'
    return refused


def _token() -> bytes | None:
    """``KEYED_QUEUE_METRICS_TOKEN`` as bytes; None when unset or not a token (a check reports it): an
    empty setting must not let an empty ``Bearer`` in."""
    token = settings.METRICS_TOKEN
    return token.encode("utf-8", "surrogatepass") if isinstance(token, str) and token.strip() else None


def _bearer(request: HttpRequest) -> bytes | None:
    """The credentials of the request's ``Authorization: Bearer <credentials>``, as bytes; None without."""
    header = request.META.get("HTTP_AUTHORIZATION", "")
    scheme, _, credentials = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    credentials = credentials.strip()
    try:
        return credentials.encode("latin-1")  # a server's header is its bytes as latin-1 (PEP 3333, ASGI)
    except UnicodeEncodeError:
        return credentials.encode("utf-8", "surrogatepass")  # text no server sends, but a test client can


def _same(offered: bytes, token: bytes) -> bool:
    """In constant time: both are hashed first and the digests compared, so its time tells nothing of
    the token, neither its length nor how much of a guess matched."""
    return compare_digest(hashlib.sha256(offered).digest(), hashlib.sha256(token).digest())


def _scrape(request: HttpRequest) -> HttpResponse:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)


class _Collector:
    def collect(self) -> Iterator[Metric]:
        try:
            gate = console_gate()
            amounts, counted = gate.totals()
            templates = {**_registered_templates(), **counted}  # every task known, counted or not
            submissions.write_page(gate)  # recent submissions count as waiting also while no worker runs
        except Exception:
            logger.warning("keyed queue metrics: the gate's Redis did not answer", exc_info=True)
            yield _gauge("gate_up", "1 when the gate's Redis answered this scrape.", 0)
            yield from _record_gauges({})
            return
        yield _gauge("gate_up", "1 when the gate's Redis answered this scrape.", 1)
        yield from _totals(amounts, templates)
        yield from _record_gauges(templates)
        yield from _gate_gauges(gate)


def _labels(series: str) -> list[str]:
    return ["task", "key_template", "outcome"] if series in WITH_OUTCOME else ["task", "key_template"]


def _label_values(series: str, task_name: str, outcome: str, templates: dict[str, str]) -> list[str]:
    """The values of ``_labels(series)``."""
    return [task_name, templates.get(task_name, ""), *([outcome] if series in WITH_OUTCOME else [])]


def _totals(amounts: dict[str, str], templates: dict[str, str]) -> Iterable[Metric]:
    counters = {
        name: CounterMetricFamily(f"keyed_queue_{name}", doc, labels=_labels(name))
        for name, doc in COUNTER_HELP.items()
    }
    # (series, task, outcome) -> bucket -> count, and the sums
    buckets: dict[tuple[str, str, str], dict[str, float]] = defaultdict(dict)
    unreadable = 0
    for raw, value in sorted(amounts.items()):
        parsed = totals.parse_field(raw)
        try:
            number = float(value)
        except ValueError:
            parsed = None
        if parsed is None:
            unreadable += 1
            continue
        series, task_name, outcome, bucket = parsed
        if series in counters:
            counters[series].add_metric(_label_values(series, task_name, outcome, templates), number)
        else:
            buckets[series, task_name, outcome][bucket] = number
    if unreadable:
        logger.warning("keyed queue metrics: %d totals fields are not ours and were left out", unreadable)
    for series, counter in counters.items():
        _from_zero(series, counter, templates)
    yield from counters.values()
    for name, doc in HISTOGRAM_HELP.items():
        family = HistogramMetricFamily(f"keyed_queue_{name}", doc, labels=_labels(name))
        for (series, task_name, outcome), counts in buckets.items():
            if series != name:
                continue
            cumulative, running = [], 0.0
            for bound in [*map(repr, totals.BUCKETS), totals.INF]:
                running += counts.get(bound, 0.0)
                cumulative.append((bound, running))
            labels = _label_values(name, task_name, outcome, templates)
            family.add_metric(labels, cumulative, sum_value=counts.get(totals.SUM, 0.0))
        yield family


@cache
def _registered_templates() -> dict[str, str]:
    """The key template label of each keyed task this project registers (its task modules imported once, as
    Celery's worker imports them): their counters are exported from zero before any process counts one."""
    app = current_app
    app.loader.import_default_modules()
    return {name: totals.template_of(task) for name, task in list(app.tasks.items()) if hasattr(task, "serial_key")}


def _from_zero(series: str, family: CounterMetricFamily, templates: dict[str, str]) -> None:
    """A 0 sample of ``series`` for each task the totals name and outcome of ``OUTCOMES_FROM_ZERO`` it has none of."""
    counted = {tuple(s.labels[label] for label in _labels(series)) for s in family.samples}
    for task_name in sorted(templates):
        for outcome in OUTCOMES_FROM_ZERO.get(series, ("",)):
            labels = _label_values(series, task_name, outcome, templates)
            if tuple(labels) not in counted:
                family.add_metric(labels, 0.0)


def _record_gauges(templates: dict[str, str]) -> Iterable[Metric]:
    """What the records say now: tasks waiting and holding a slot per task, active keys, the oldest wait."""
    active = KeyedTask.objects.active()
    by_task: dict[str, dict[str, int]] = {name: {} for name in templates}
    for row in active.values("task_name", "status").annotate(n=Count("pk")).order_by():
        by_task.setdefault(row["task_name"], {})[row["status"]] = row["n"]
    waiting = GaugeMetricFamily(
        "keyed_queue_tasks_waiting", "Tasks waiting for their key.", labels=["task", "key_template"]
    )
    running = GaugeMetricFamily(
        "keyed_queue_tasks_running",
        "Tasks holding one of their key's slots: dispatched, running, or retrying after a countdown.",
        labels=["task", "key_template"],
    )
    for task_name, statuses in sorted(by_task.items()):
        labels = [task_name, templates.get(task_name, "")]
        waiting.add_metric(labels, statuses.get(Status.WAITING, 0))
        running.add_metric(labels, sum(statuses.get(s, 0) for s in HOLDING))
    yield waiting
    yield running
    yield _gauge("keys_active", "Keys with a task waiting or holding a slot.", active.values("key").distinct().count())
    waited = KeyedTask.objects.waited_longest_seconds()
    yield _gauge("oldest_wait_seconds", "How long the longest-waiting task has waited.", waited)
    top = settings.METRICS_TOP_KEYS
    top = min(max(top, 0), MAX_TOP_KEYS) if type(top) is int else 0  # a check reports a bad value
    if top:
        family = GaugeMetricFamily(
            "keyed_queue_key_oldest_wait_seconds",
            f"The {top} keys whose oldest waiting task waited longest (KEYED_QUEUE_METRICS_TOP_KEYS).",
            labels=["key"],
        )
        rows = KeyedTask.objects.with_status(Status.WAITING).values("key").annotate(at=Min("enqueued_at"))
        for waiting_key in rows.order_by("at")[:top]:
            family.add_metric([waiting_key["key"]], seconds_since(waiting_key["at"]))
        yield family


def _gate_gauges(gate: ConsoleGate) -> Iterable[Metric]:
    yield _gauge("keys_paused", "Keys an operator paused.", len(gate.paused_keys()))
    yield _gauge(
        "keys_blocked",
        "Keys a failed task blocks (on_failure='block') until an operator retries or cancels it.",
        len(gate.blocked_keys(limit=MAX_KEYS_READ)),
    )
    overdue = gate.overdue_keys(stuck_after_seconds(), limit=MAX_KEYS_READ)
    yield _gauge("keys_overdue", "Keys past a deadline for over two reaper periods: is a reaper running?", len(overdue))
    yield _gauge(
        "runs_unrenewed",
        "Running tasks whose worker stopped renewing their lease: it may be lost (the reaper ends them at lease end).",
        unrenewed_runs(gate, limit=MAX_KEYS_READ),
    )
    yield from _pool_gauges(gate)


def _pool_gauges(gate: ConsoleGate) -> Iterable[Metric]:
    """Each pool's running, waiting and limit, labelled by its name (a project names a few, in its settings).
    A pool with no limit has no limit sample: a 0 would read as a pool where nothing may run."""
    pools = pool_states(gate)
    for name, doc, read in (
        ("pool_running", "Tasks holding a slot of their pool.", lambda p: p.running),
        ("pool_waiting", "Tasks waiting for a slot of their pool (each holds its key).", lambda p: p.waiting),
        ("pool_limit", "A pool's limit in force (an operator's, else the settings'); none for no limit.",
         lambda p: p.limit or None),
    ):  # fmt: skip
        family = GaugeMetricFamily(f"keyed_queue_{name}", doc, labels=["pool"])
        for pool in pools:
            if (value := read(pool)) is not None:
                family.add_metric([pool.name], value)
        yield family


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"keyed_queue_{name}", doc, value=value)
