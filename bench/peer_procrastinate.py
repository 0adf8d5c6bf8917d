"""procrastinate, the peer of ``python -m bench.userproject --database postgresql --peer procrastinate``.

procrastinate runs jobs it keeps in PostgreSQL. A job deferred with ``lock=KEY`` does not start while a job of
the same lock runs, and a lock's jobs start in the order they were deferred: the per-key order and exclusion of
the keyed tasks. It runs in the same user's project, on the same PostgreSQL database as the keyed records,
through procrastinate's Django integration (``procrastinate.contrib.django``):

- settings: ``INSTALLED_APPS += ["procrastinate.contrib.django"]`` (the project's ``migrate`` makes its tables),
  ``PROCRASTINATE_IMPORT_PATHS`` naming the task's module, and the worker's log at INFO (a line as each job
  starts and ends, as the Celery worker's ``-l INFO`` writes one as each task arrives and ends);
- the task and its producer: bench/userproject_procrastinate.py, copied into the project; the task's body is
  the plain and keyed tasks' own, and the producer defers each task with ``lock=<its key>``;
- one worker, at the Celery worker's concurrency: ``python manage.py procrastinate worker --concurrency 2
  --fetch-job-polling-interval 0.01``, told of new jobs by LISTEN/NOTIFY (its default). A job that waited on
  its lock is not announced when the lock frees: the worker finds it on its next poll, hence the short poll.

The worker runs only during the peer's rounds: started before a round's first submission, stopped once its
last job is recorded. Its poll would otherwise load the plain and keyed rounds beside it.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from importlib.metadata import version
from pathlib import Path

from testproject.userproject.project import UserProject

NAME = "procrastinate"
MODULE = Path(__file__).resolve().parent / "userproject_procrastinate.py"
#: The module's name in the project's directory (the worker imports it by this name).
MODULE_NAME = "bench_procrastinate"
#: Seconds between the worker's polls for jobs no notification announced: those a lock held back.
POLLING_INTERVAL = 0.01
#: The worker's logger only: the producer logs nothing per job, as Celery's does not.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "[%(asctime)s: %(levelname)s/%(name)s] %(message)s"}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {"procrastinate.worker": {"handlers": ["stderr"], "level": "INFO"}},
}
READY_LINE = b"Starting worker"


class ProcrastinatePeer:
    """procrastinate installed in the user's project, and its worker, one round at a time."""

    name = NAME
    script = f"{MODULE_NAME}.py"
    #: Each status and how many of the jobs of the ids given (``%s``) have it.
    status_query = "SELECT status::text, COUNT(*) FROM procrastinate_jobs WHERE id = ANY(%s) GROUP BY status"
    #: The statuses of a job that will not run again.
    terminal_statuses = frozenset({"succeeded", "failed", "cancelled", "aborted"})

    def __init__(self, project: UserProject, concurrency: int) -> None:
        self.project = project
        self.concurrency = concurrency
        self.log_path = project.directory / "logs" / "procrastinate-worker.log"
        self._ready_before = 0  # the log is appended to: only a start logged after the last launch counts

    @property
    def version(self) -> str:
        return version("procrastinate")

    def describe(self) -> str:
        return (
            f"procrastinate {self.version}: 1 worker x {self.concurrency} (LISTEN/NOTIFY, polls every "
            f"{POLLING_INTERVAL} s), running during its rounds only"
        )

    def install(self) -> None:
        """Into the built project, before its ``migrate``: the settings and the task's module."""
        with open(self.project.directory / "mysite" / "settings.py", "a") as settings:
            settings.write(
                '\nINSTALLED_APPS += ["procrastinate.contrib.django"]\n'
                f"PROCRASTINATE_IMPORT_PATHS = [{MODULE_NAME!r}]\n"
                f"LOGGING = {LOGGING!r}\n"
            )
        shutil.copy(MODULE, self.project.directory / self.script)

    def worker_command(self) -> list[str]:
        return [
            *(sys.executable, "manage.py", "procrastinate", "worker"),
            *("--concurrency", str(self.concurrency), "--fetch-job-polling-interval", str(POLLING_INTERVAL)),
        ]

    @contextmanager
    def worker(self, timeout: float = 60) -> Iterator[int]:
        """A worker, ready for jobs, for the ``with`` block; its pid. Then stopped (SIGTERM: it lets its running
        jobs end and exits)."""
        process = self._launch()
        try:
            self._wait_ready(process, time.monotonic() + timeout)
            yield process.pid
        finally:
            stop(process)

    def _launch(self) -> subprocess.Popen:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._ready_before = self.log_path.read_bytes().count(READY_LINE) if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            return subprocess.Popen(
                self.worker_command(),
                cwd=self.project.directory,
                env=self.project.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stop() reaches whatever it leaves
            )

    def _wait_ready(self, process: subprocess.Popen, deadline: float) -> None:
        """Until the worker logged its start (after this launch): then it fetches jobs and listens for more."""
        while self.log_path.read_bytes().count(READY_LINE) <= self._ready_before:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the procrastinate worker did not start:\n{self.log()[-3000:]}")
            time.sleep(0.05)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_problems(self) -> list[str]:
        """The worker's log lines at WARNING or worse, and tracebacks."""
        pattern = re.compile(r"WARNING|ERROR|CRITICAL|Traceback")
        return [f"procrastinate: {line}" for line in self.log().splitlines() if pattern.search(line)]


def stop(process: subprocess.Popen, timeout: float = 30) -> None:
    """SIGTERM (the worker finishes its running jobs and exits), then SIGKILL to whatever is left of its group."""
    if process.poll() is None:
        process.terminate()
        with suppress(subprocess.TimeoutExpired):
            process.wait(timeout)
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # the group outlives its leader only while a member lives
    process.wait(10)
