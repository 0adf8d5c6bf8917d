"""Real servers and workers for the demo, the tests and the benchmarks: redis-server and celery worker processes."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import redis

ROOT = Path(__file__).resolve().parent.parent


class RedisServer:
    def __init__(self, url: str, directory: Path) -> None:
        self.url = url
        self.port = urlparse(url).port
        self.directory = directory
        self.process: subprocess.Popen | None = None

    def start(self, *extra: str) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (Debian package redis-server)")
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.directory / "redis.log", "ab") as log:
            self.process = subprocess.Popen(
                [
                    binary,
                    "--port",
                    str(self.port),
                    "--bind",
                    "127.0.0.1",
                    "--dir",
                    str(self.directory),
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--protected-mode",
                    "no",
                    *extra,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 10
        while True:
            try:
                with redis.Redis(port=self.port) as client:
                    client.ping()
                return
            except redis.ConnectionError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server did not start: see {self.directory / 'redis.log'}")
                time.sleep(0.05)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)


class Worker:
    """A real ``celery worker`` (prefork) of the testproject, in its own process group."""

    def __init__(
        self,
        name: str,
        log_dir: Path,
        concurrency: int = 2,
        extra_env: dict | None = None,
        queues: str = "celery",
    ) -> None:
        self.name = name
        self.queues = queues
        self.log_path = log_dir / f"worker-{name}.log"
        self.concurrency = concurrency
        self.extra_env = extra_env or {}
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 30) -> Worker:
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "testproject.settings", **self.extra_env}
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    "testproject",
                    "worker",
                    "-P",
                    "prefork",
                    "-c",
                    str(self.concurrency),
                    "-n",
                    f"{self.name}@%h",
                    "-l",
                    "INFO",
                    "-Q",
                    self.queues,
                    "--without-gossip",
                    "--without-mingle",
                    "--without-heartbeat",
                ],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while b" ready." not in self.log_path.read_bytes():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"worker {self.name} did not start:\n{self.log()[-3000:]}")
            time.sleep(0.1)
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 30) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)


def parent_pid(pid: int) -> int:
    """The parent of a process, from /proc (pool processes belong to their worker)."""
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])
