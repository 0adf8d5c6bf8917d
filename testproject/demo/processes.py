"""The demo's processes: its redis-server, its worker, its web server, and stopping all of them on a signal.

The redis-server and the worker each run in a session of their own, so that a
Ctrl-C in the terminal reaches the demo alone, which then stops the worker
before the Redis it needs. SIGTERM, SIGINT and SIGHUP all raise ``Stopped`` in
the demo's main thread; what it started is stopped on the way out.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit

import redis

ROOT = Path(__file__).resolve().parents[2]
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Stopped(BaseException):
    """A stop signal arrived (a BaseException, like KeyboardInterrupt: no ``except Exception`` swallows it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class DemoError(Exception):
    """The demo cannot start; the message says why and what to do."""


def stop_on_signals() -> None:
    """Make SIGTERM, SIGINT and SIGHUP raise ``Stopped`` once; later ones are ignored while the demo stops."""

    def stop(signum: int, frame: object) -> None:
        for other in SIGNALS:
            signal.signal(other, signal.SIG_IGN)
        raise Stopped(signum)

    for signum in SIGNALS:
        signal.signal(signum, stop)


def lock_data_dir(data_dir: Path) -> IO:
    """Hold the data directory for this run: two demos on one SQLite file and one Redis data directory would
    corrupt both. The lock goes with the process, however it ends."""
    handle = open(data_dir / "demo.lock", "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "?"
        handle.close()
        raise DemoError(f"another demo (pid {holder}) is running with the data in {data_dir}; stop it first") from None
    handle.truncate(0)
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


# -- redis-server ------------------------------------------------------------


def has_redis_data(directory: Path) -> bool:
    """Whether ``directory`` holds a persisted Redis (the append-only file of Redis 7, or of Redis 6)."""
    return (directory / "appendonlydir").is_dir() or (directory / "appendonly.aof").is_file()


def remove_redis_data(directory: Path) -> None:
    shutil.rmtree(directory / "appendonlydir", ignore_errors=True)
    for name in ("appendonly.aof", "dump.rdb"):
        (directory / name).unlink(missing_ok=True)


def start_redis(url: str, directory: Path) -> subprocess.Popen:
    """A redis-server on ``url``'s port whose data lives in ``directory`` between runs (append-only file).

    Returns at once, so that the caller can arrange its stop before ``wait_for_redis``.
    """
    binary = shutil.which("redis-server")
    if binary is None:
        raise DemoError("redis-server is not installed (Debian package redis-server; `make demo` installs it)")
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "redis.log", "ab") as log:
        return subprocess.Popen(
            [
                *(binary, "--port", str(urlsplit(url).port), "--bind", "127.0.0.1", "--protected-mode", "no"),
                *("--dir", str(directory), "--appendonly", "yes", "--save", ""),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def wait_for_redis(process: subprocess.Popen, url: str, directory: Path, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with redis.Redis.from_url(url) as client:
                client.ping()
            return
        except redis.ConnectionError:  # also BusyLoadingError, while it reads its append-only file
            if process.poll() is not None or time.monotonic() > deadline:
                raise DemoError(f"redis-server did not start: see {directory / 'redis.log'}") from None
            time.sleep(0.05)


def stop_process(process: subprocess.Popen, timeout: float = 10) -> None:
    """SIGTERM (Redis writes its append-only file and exits), SIGKILL if it does not end in ``timeout``."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# -- the worker ----------------------------------------------------------------


def start_worker(log_path: Path, concurrency: int = 3) -> subprocess.Popen:
    """A celery worker of the testproject, in a session of its own; ``wait_until_ready`` waits for it.

    Started before the demo migrates its database, so that the two overlap: a worker touches
    the database only for tasks and for what its reaper finds, and there is none before the
    demo submits (a re-run's database is already migrated).
    """
    from testproject.servers import QUIET_WORKER_ARGS

    log_path.parent.mkdir(parents=True, exist_ok=True)
    if log_path.exists():  # ready is read from the log: keep the last run's log aside, as <name>.1
        log_path.replace(log_path.with_name(log_path.name + ".1"))
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [
                *(sys.executable, "-m", "celery", "-A", "testproject", "worker", "-P", "prefork"),
                *("-c", str(concurrency), "-n", "demo@%h", "-l", "INFO", "-Q", "celery", *QUIET_WORKER_ARGS),
            ],
            cwd=ROOT,
            env={**os.environ, "DJANGO_SETTINGS_MODULE": "testproject.settings"},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def wait_until_ready(process: subprocess.Popen, log_path: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while b" ready." not in log_path.read_bytes():
        if process.poll() is not None or time.monotonic() > deadline:
            tail = log_path.read_text(errors="replace")[-3000:]
            raise DemoError(f"the celery worker did not start (log: {log_path}):\n{tail}")
        time.sleep(0.05)


def stop_worker(process: subprocess.Popen | None, timeout: float = 5.0) -> None:
    """Stop a worker started in a session of its own, and every process of that session.

    A cold shutdown (SIGQUIT): a warm one would wait for the slow report (a minute), and takes
    seconds even when nothing runs. A task cut this way is recovered as after any lost worker:
    its lease runs out and a worker's reaper (the next run's) dispatches it again; an outcome whose
    record was not written yet is written back by the reaper. SIGKILL to whatever is left.
    """
    if process is None:
        return
    if process.poll() is None:
        process.send_signal(signal.SIGQUIT)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
    try:
        # The worker leads its process group; a group id is not reused while a member lives,
        # so this reaches only pool processes that outlived their worker.
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


# -- the web server --------------------------------------------------------------


def bind_web_server(port: int):
    """The admin's HTTP server, bound now (a port in use fails before anything starts), served later.

    Django's development server, as ``runserver`` makes it, in the demo's own process: a signal
    stops it with the demo (``runserver`` would end the process with ``os._exit`` on some errors,
    leaving the worker and Redis behind).
    """
    from django.core.servers.basehttp import ThreadedWSGIServer, WSGIRequestHandler

    try:
        return ThreadedWSGIServer(("127.0.0.1", port), WSGIRequestHandler)
    except OSError as exc:
        raise DemoError(f"cannot serve the admin on 127.0.0.1:{port} ({exc.strerror}): try --port N") from None


def serve(server) -> None:
    """Serve the admin (static files too, as ``runserver`` does) until a signal stops the demo."""
    from django.contrib.staticfiles.handlers import StaticFilesHandler
    from django.core.wsgi import get_wsgi_application

    server.set_app(StaticFilesHandler(get_wsgi_application()))
    server.serve_forever()
