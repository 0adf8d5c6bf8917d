"""A process's counts for the metrics, added to the deployment's totals in the gate's Redis every second.

Series are counted by task name and outcome, never by key: a key's value is no label (a million
keys would be a million series). Each task's key template, the other label, is written with its
counts. What a process counted in its last second is lost if it is killed (SIGKILL); a process
that exits, or a child process Celery shuts down, adds it first.
"""

from __future__ import annotations

import bisect
import functools
import json
import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol

from ..gate import Gate
from ..records.columns import TASK_NAME_MAX_LENGTH

logger = logging.getLogger(__name__)

#: The counters (each ``keyed_queue_<name>_total``; see docs/metrics.md).
COUNTERS = ("submitted", "started", "finished", "recovered", "fenced", "handed_over", "refused")
#: The histograms, in seconds: the wait for the key (submission, or eta, to start) and a run's time.
HISTOGRAMS = ("wait_seconds", "run_seconds")
#: The histograms' upper bounds, seconds: a key's wait runs from milliseconds to hours.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
INF = "+Inf"
#: A histogram's sum is kept in the field of this bucket.
SUM = "sum"
#: How often a process adds what it counted to the totals.
FLUSH_SECONDS = 1.0


class CountedTask(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def serial_key(self) -> Any: ...


@functools.lru_cache(maxsize=4096)  # the labels' combinations are few: tasks x outcomes x buckets
def field(series: str, task_name: str, outcome: str = "", bucket: str = "") -> str:
    """The totals' field of one series and its labels (a task name as long as a record keeps it)."""
    labels = [series, task_name[:TASK_NAME_MAX_LENGTH], outcome, bucket]
    return json.dumps(labels, ensure_ascii=False, separators=(",", ":"))


def parse_field(raw: str) -> tuple[str, str, str, str] | None:
    """A field made by :func:`field` as (series, task name, outcome, bucket); None for anything else."""
    try:
        parts = json.loads(raw)
    except ValueError:
        return None
    if not (isinstance(parts, list) and len(parts) == 4 and all(isinstance(p, str) for p in parts)):
        return None
    series, task_name, outcome, bucket = parts
    if series not in COUNTERS and series not in HISTOGRAMS:
        return None
    return series, task_name, outcome, bucket


def template_of(task: CountedTask) -> str:
    """The key template label of ``task``: its template, the key a pool's keyless tasks share (their key
    function's ``key_template``), or the key function's dotted name."""
    spec = task.serial_key
    if isinstance(spec, str):
        return spec
    if isinstance(shared := getattr(spec, "key_template", None), str):
        return shared
    return f"{getattr(spec, '__module__', '?')}.{getattr(spec, '__qualname__', '?')}()"


def bucket_of(seconds: float) -> str:
    """The bucket ``seconds`` falls in: the least bound at or above it."""
    i = bisect.bisect_left(BUCKETS, seconds)
    return repr(BUCKETS[i]) if i < len(BUCKETS) else INF


class Totals:
    """What this process counted since it last added to the gate's totals."""

    def __init__(self, gate: Callable[[], Gate]) -> None:
        self._gate = gate
        self._lock = threading.Lock()
        # One flush at a time: a flush returns once all counted before it was added (or kept to retry),
        # also when the background thread took it a moment earlier.
        self._flushing = threading.Lock()
        self._pending: dict[str, int | float] = {}
        self._templates: dict[str, str] = {}
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def count(self, series: str, task: CountedTask | str, outcome: str = "", n: int = 1) -> None:
        """Count ``n`` of ``series`` for ``task`` (a task, or only its name where no task is at hand)."""
        self._add({field(series, self._name(task), outcome): n})

    def observe(self, series: str, task: CountedTask | str, seconds: float, outcome: str = "") -> None:
        """Note one observation of the histogram ``series``."""
        name, seconds = self._name(task), max(0.0, seconds)
        self._add({field(series, name, outcome, bucket_of(seconds)): 1, field(series, name, outcome, SUM): seconds})

    def _name(self, task: CountedTask | str) -> str:
        if isinstance(task, str):
            return task
        # Written with each flush that counts the task: the totals get it back if Redis lost them.
        with self._lock:
            self._templates[task.name] = template_of(task)
        return task.name

    def _add(self, amounts: dict[str, int | float]) -> None:
        with self._lock:
            for name, amount in amounts.items():
                self._pending[name] = self._pending.get(name, 0) + amount
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="keyed-queue-totals", daemon=True)
                self._thread.start()

    def flush(self) -> None:
        """Add what was counted to the totals; kept for the next try if Redis does not answer."""
        with self._flushing:
            self._flush()

    def _flush(self) -> None:
        with self._lock:
            amounts, self._pending = self._pending, {}
            templates, self._templates = self._templates, {}
        if not amounts and not templates:
            return
        try:
            self._gate().add_totals(amounts, templates)
        except Exception:
            with self._lock:
                for name, amount in amounts.items():
                    self._pending[name] = self._pending.get(name, 0) + amount
                self._templates = {**templates, **self._templates}
            raise

    def close(self) -> None:
        self._stop.set()
        try:
            self.flush()
        except Exception:
            logger.warning("the keyed queue's last counts for the metrics were not added", exc_info=True)

    def _run(self) -> None:
        while not self._stop.wait(FLUSH_SECONDS):
            try:
                self.flush()
            except Exception:
                logger.debug("adding the keyed queue's counts to the totals failed; will try again", exc_info=True)
