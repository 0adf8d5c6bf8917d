"""Real servers and workers for the demo, the tests and the benchmarks: redis-server, PostgreSQL and celery workers."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from urllib.parse import urlparse

import redis

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerError(RuntimeError):
    """A server or worker did not start."""


class RedisServer:
    def __init__(self, url: str, directory: Path) -> None:
        self.url = url
        self.port = urlparse(url).port
        self.directory = directory
        self.process: subprocess.Popen | None = None

    def start(self, *extra: str) -> None:
        self.launch(*extra).wait_ready()

    def launch(self, *extra: str) -> RedisServer:
        """Start it and return at once (so that a caller can arrange its stop before waiting).

        In a session of its own: a Ctrl-C in the terminal reaches its owner alone, which stops it.
        """
        binary = shutil.which("redis-server")
        if binary is None:
            raise ServerError("redis-server is not installed (Debian package redis-server)")
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.directory / "redis.log", "ab") as log:
            self.process = subprocess.Popen(
                [
                    *(binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory)),
                    *("--save", "", "--appendonly", "no", "--protected-mode", "no", *extra),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def wait_ready(self, timeout: float = 10) -> RedisServer:
        assert self.process is not None, "launch() first"
        deadline = time.monotonic() + timeout
        while True:
            try:
                with redis.Redis(port=self.port) as client:
                    client.ping()
                return self
            except redis.AuthenticationError:  # it answered: its ACL file turns the default user off
                return self
            except redis.ConnectionError:  # also BusyLoadingError, while it reads its append-only file
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise ServerError(f"redis-server did not start: see {self.directory / 'redis.log'}") from None
                time.sleep(0.05)

    def stop(self, timeout: float = 10) -> None:
        """SIGTERM (with an append-only file, Redis writes it and exits); SIGKILL if it does not end in time."""
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


#: Redis as it runs under a broker in production: every write on disk before it is acknowledged.
AOF_ALWAYS = ("--appendonly", "yes", "--appendfsync", "always")


@contextmanager
def persistent_redis(directory: Path) -> Iterator[RedisServer]:
    """A redis-server on a free port whose data outlives a kill; restart it with ``start(*AOF_ALWAYS)``."""
    server = RedisServer(f"redis://127.0.0.1:{free_port()}", directory)
    server.start(*AOF_ALWAYS)
    try:
        yield server
    finally:
        server.stop()


class PostgresServer:
    """A throwaway PostgreSQL cluster: initdb in a temp dir, its unix socket there, trust auth, no fsync.

    PostgreSQL refuses to run as root; as root it runs as the ``postgres`` user (or ``nobody``),
    which owns the temp dir. Nothing listens on TCP: clients connect through the socket.
    """

    def __init__(self, log_dir: Path | None = None, user: str = "postgres", durable: bool = False) -> None:
        self.log_dir = log_dir
        self.user = user
        #: Commits wait for the disk, as on a user's server (the benchmarks); else no fsync (the tests).
        self.durable = durable
        self.port = free_port()  # names the socket file; other clusters in other dirs may share it
        self.directory: Path | None = None

    def url(self, database: str) -> str:
        """A libpq URL of a database of this server (the form ``TESTPROJECT_DATABASE_URL`` takes)."""
        return f"postgresql://{self.user}@:{self.port}/{database}?host={self.directory}"

    def start(self) -> PostgresServer:
        bindir = postgres_bindir()
        self.directory = Path(tempfile.mkdtemp(prefix="keyed-queue-pg-"))
        owner = _unprivileged()
        if owner:
            os.chown(self.directory, owner["user"], owner["group"])
        data = self.directory / "data"
        self._run([bindir / "initdb", "-D", data, "-U", self.user, "--auth=trust", "-E", "UTF8", "--locale=C"], owner)
        with open(data / "postgresql.conf", "a") as conf:
            # A test and benchmark server: losing it in a crash loses nothing of value.
            conf.write(
                f"port = {self.port}\nunix_socket_directories = '{self.directory}'\nlisten_addresses = ''\n"
                "max_connections = 50\n"
            )
            if not self.durable:
                conf.write("fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n")
        log = self.directory / "postgres.log"
        self._run([bindir / "pg_ctl", "-D", data, "-l", log, "-w", "-t", "60", "start"], owner)
        return self

    def create_database(self, name: str) -> None:
        import psycopg

        with psycopg.connect(host=str(self.directory), port=self.port, user=self.user, dbname="postgres") as conn:
            conn.autocommit = True
            conn.execute(f'CREATE DATABASE "{name}"')

    def stop(self) -> None:
        """Stop the server, keep its log in ``log_dir`` and remove its files."""
        if self.directory is None:
            return
        directory, self.directory = self.directory, None
        if (directory / "data" / "postmaster.pid").exists():
            self._run(
                [postgres_bindir() / "pg_ctl", "-D", directory / "data", "-m", "fast", "-w", "stop"], _unprivileged()
            )
        if self.log_dir is not None and (directory / "postgres.log").exists():
            self.log_dir.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(directory / "postgres.log", self.log_dir / "postgres.log")
        shutil.rmtree(directory, ignore_errors=True)

    def _run(self, command: list, owner: dict) -> None:
        done = subprocess.run([str(c) for c in command], capture_output=True, text=True, **owner)
        if done.returncode != 0:
            raise RuntimeError(f"{Path(command[0]).name} failed:\n{done.stdout}{done.stderr}")


def postgres_bindir() -> Path:
    """Where initdb and pg_ctl are: on PATH, or Debian's versioned directory (not on PATH)."""
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    if not versions:
        raise RuntimeError("PostgreSQL is not installed (Debian package postgresql)")
    return versions[-1].parent


def _unprivileged() -> dict:
    """``subprocess`` arguments that drop root for PostgreSQL's programs; none for another user."""
    if os.geteuid() != 0:
        return {}
    for name in ("postgres", "nobody"):
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            continue
        return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
    raise RuntimeError("running as root and neither a postgres nor a nobody user exists to run PostgreSQL")


#: The test workers' options: no worker-to-worker chatter, which the tests do not need.
QUIET_WORKER_ARGS = ("--without-gossip", "--without-mingle", "--without-heartbeat")


class Worker:
    """A real ``celery worker`` (prefork) of a project (the testproject by default), in its own process group."""

    def __init__(
        self,
        name: str,
        log_dir: Path,
        concurrency: int = 2,
        extra_env: dict | None = None,
        queues: str = "celery",
        args: tuple[str, ...] = QUIET_WORKER_ARGS,
        project: str = "testproject",
        cwd: Path = ROOT,
        base_env: dict | None = None,
    ) -> None:
        self.name = name
        self.queues = queues
        self.log_path = log_dir / f"worker-{name}.log"
        self.concurrency = concurrency
        self.extra_env = extra_env or {}
        self.args = args
        self.project = project
        self.cwd = cwd
        #: The environment the worker starts from (this process's by default), before ``extra_env``.
        self.base_env = base_env
        self.process: subprocess.Popen | None = None
        self._ready_before = 0

    def start(self, timeout: float = 30) -> Worker:
        return self.launch().wait_ready(timeout)

    def launch(self) -> Worker:
        """Start it and return at once; :meth:`wait_ready` waits until it consumes."""
        base = os.environ if self.base_env is None else self.base_env
        env = {**base, "DJANGO_SETTINGS_MODULE": f"{self.project}.settings", **self.extra_env}
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # The log is appended to: only a "ready" written after this launch counts.
        self._ready_before = self.log_path.read_bytes().count(b" ready.") if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [
                    *(sys.executable, "-m", "celery", "-A", self.project, "worker", "-P", "prefork"),
                    *("-c", str(self.concurrency), "-n", f"{self.name}@%h", "-l", "INFO", "-Q", self.queues),
                    *self.args,
                ],
                cwd=self.cwd,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def wait_ready(self, timeout: float = 30) -> Worker:
        assert self.process is not None, "launch() first"
        deadline = time.monotonic() + timeout
        while self.log_path.read_bytes().count(b" ready.") <= self._ready_before:
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.kill()  # nothing it started may outlive the failure
                raise ServerError(f"worker {self.name} did not start:\n{self.log()[-3000:]}")
            time.sleep(0.05)
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 30, *, cold: bool = False) -> None:
        """A warm shutdown (SIGTERM: running tasks finish), or with ``cold`` SIGQUIT (they are cut
        and recovered as after any lost worker); then SIGKILL to whatever is left of its group."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGQUIT if cold else signal.SIGTERM)
            with suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout)
        self.kill()

    def kill(self) -> None:
        """SIGKILL to the worker and its pool at once: a test's end, where nothing they do is checked."""
        if self.process is None:
            return
        # The worker leads its process group; a group id is not reused while a member lives, so this
        # reaches only the worker and child processes that outlived it.
        with suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)


def parent_pid(pid: int) -> int:
    """The parent of a process, from /proc (child processes belong to their worker)."""
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])
