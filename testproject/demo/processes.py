"""The demo's own process handling: its data dir's lock, its web server, and stopping on a signal.

Its redis-server and worker are testproject.servers' (each in a session of its own, so that a
Ctrl-C in the terminal reaches the demo alone, which then stops the worker before the Redis it
needs). SIGTERM, SIGINT and SIGHUP all raise ``Stopped`` in
the demo's main thread; what it started is stopped on the way out.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
from pathlib import Path
from typing import IO

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
