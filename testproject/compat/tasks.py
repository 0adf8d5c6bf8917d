"""Twin tasks of the compatibility tier (tests/compat): one body, registered twice.

``@twins(...)`` registers a function as a plain Celery task (``shared_task``,
named ``compat.plain.<name>``) and as a keyed one (``keyed_serial_task``, named
``compat.keyed.<name>``), with the same options; a test runs the same calls on
both and expects what a user sees to be the same. Every keyed twin takes its
key from the ``key`` argument (``map`` items carry it inside), so the tasks of
one test share a key. Bodies note their start and end in the journal.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from celery import shared_task
from celery.exceptions import Ignore, Reject, SoftTimeLimitExceeded
from celery.utils.log import get_task_logger

from django_keyed_queue import keyed_serial_task
from testproject.demo import history

from .journal import note, running

logger = get_task_logger(__name__)


@dataclass(frozen=True)
class Twins:
    plain: Any
    keyed: Any

    def __call__(self, kind: str) -> Any:
        """The twin of ``kind``: "plain", or "keyed" (also for the tier's "keyed-waited" case)."""
        return self.plain if kind == "plain" else self.keyed


def twins(key: str = "{key}", **options: Any) -> Callable[[Callable], Twins]:
    def decorate(fun: Callable) -> Twins:
        return Twins(
            plain=shared_task(name=f"compat.plain.{fun.__name__}", **options)(fun),
            keyed=keyed_serial_task(key=key, name=f"compat.keyed.{fun.__name__}", **options)(fun),
        )

    return decorate


def twin(task: Any, name: str) -> Any:
    """The task called ``name`` of the same kind as ``task``."""
    return task.app.tasks[task.name.rsplit(".", 1)[0] + "." + name]


# -- results, states and options ------------------------------------------------


@twins()
def add(x: int, y: int, key: str = "", pause: float = 0.0) -> int:
    with running(key):
        time.sleep(pause)
        return x + y


@twins()
def tsum(values: list[int], key: str = "") -> int:
    with running(key):
        return sum(values)


@twins()
def fail(message: str, key: str = "") -> None:
    with running(key):
        raise ValueError(message)


@twins(ignore_result=True)
def quiet(x: int, key: str = "", pause: float = 0.0) -> int:
    with running(key):
        time.sleep(pause)
        return x


@twins(bind=True)
def request_fields(self, names: list[str], key: str = "") -> dict:
    """What the task's ``self.request`` holds under ``names``."""
    with running(key):
        return {name: self.request.get(name) for name in names}


@twins(bind=True)
def spawn(self, key: str = "") -> str:
    """Submits a child of its own kind and key (a keyed one waits for this run to end); returns its id."""
    with running(key):
        return twin(self, "add").delay(1, 2, key=key).id


@twins(key="{item[key]}")
def double(item: dict) -> int:
    """Takes one argument, as ``Task.map`` calls it."""
    with running(item["key"]):
        return item["n"] * 2


# -- retries, errors ----------------------------------------------------------------


@twins(bind=True, max_retries=5)
def flaky(self, failures: int, key: str = "", countdown: float = 0.2) -> int:
    """Retries its first ``failures`` attempts after ``countdown``; returns the attempt that succeeded."""
    with running(key, attempt=self.request.retries):
        if self.request.retries < failures:
            raise self.retry(countdown=countdown)
        return self.request.retries


@twins(autoretry_for=(ConnectionError,), max_retries=2, default_retry_delay=0.1, retry_jitter=False)
def unreachable(key: str = "") -> None:
    with running(key):
        raise ConnectionError("the endpoint did not answer")


@twins(bind=True, max_retries=3)
def retry_and_go_on(self, key: str = "") -> str:
    """``self.retry(throw=False)`` on its first attempt, which then goes on and returns."""
    with running(key, attempt=self.request.retries):
        if self.request.retries == 0:
            self.retry(countdown=0.5, throw=False)
            note("went on", key=key, id=self.request.id)
        return f"attempt {self.request.retries}"


@twins()
def ignored(key: str = "") -> None:
    with running(key):
        raise Ignore()


@twins(bind=True, acks_late=True)
def rejected(self, requeue: bool, key: str = "") -> str:
    """Rejects its first delivery (requeued or not); a redelivery returns how many deliveries it took."""
    deliveries = history.client().incr(f"testproject:compat:deliveries:{self.request.id}")
    with running(key, delivery=deliveries):
        if deliveries == 1:
            raise Reject("rejected on purpose", requeue=requeue)
        return f"delivery {deliveries}"


# -- replacement, canvas ---------------------------------------------------------


@twins(bind=True)
def replaced(self, x: int, key: str = "", depth: int = 1, countdown: float = 0.0):
    """Replaces itself ``depth - 1`` times with itself, then with ``add(x, 1)`` of its kind; each
    replacement with ``countdown`` if given."""
    delay = {"countdown": countdown} if countdown else {}
    with running(key, depth=depth):
        if depth > 1:
            raise self.replace(self.s(x, key=key, depth=depth - 1, countdown=countdown).set(**delay))
        raise self.replace(twin(self, "add").s(x, 1, key=key).set(**delay))


@twins()
def on_error(request, exc, traceback, key: str = "") -> None:
    """An errback (``link_error``): Celery calls it with the failed task's request, exception and traceback."""
    note("errback", key=key, failed=request.id, exc=repr(exc))


# -- revocation, signals, events, logging, time limits -------------------------------


@twins()
def sleeper(seconds: float, key: str = "") -> float:
    with running(key):
        time.sleep(seconds)
        return seconds


@twins()
def logs(marker: str, key: str = "") -> str:
    with running(key):
        logger.info("compat log line %s", marker)
        return marker


@twins(soft_time_limit=0.5)
def soft_limited(key: str = "") -> str:
    with running(key):
        try:
            time.sleep(10)
        except SoftTimeLimitExceeded:
            return "caught SoftTimeLimitExceeded"
        return "slept"


@twins(time_limit=1)
def hard_limited(key: str = "") -> str:
    with running(key):
        time.sleep(10)
        return "slept"


@twins(typing=False)
def untyped(x: int, y: int, key: str = "") -> int:
    with running(key):
        return x + y


# -- pydantic (Celery 5.5+; the tier skips it where pydantic is not installed) --------------

try:
    from pydantic import BaseModel
except ImportError:  # pragma: no cover
    BaseModel = None

if BaseModel is not None:

    class Person(BaseModel):
        name: str

    class Greeting(BaseModel):
        text: str

    @twins(pydantic=True)
    def greet(person: Person, key: str = "") -> Greeting:
        with running(key):
            return Greeting(text=f"hello {person.name}")
