"""Crash tests: their own workers with short leases, on a queue of their own."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from django.test import override_settings

from testproject.servers import Worker
from tests.chaos.timings import TIMINGS, timing_env


class Chaos:
    def __init__(self, queue: str, log_dir: Path) -> None:
        self.queue = queue
        self.log_dir = log_dir
        self.workers: list[Worker] = []

    def start(self, count: int = 2, concurrency: int = 2, env: dict | None = None) -> list[Worker]:
        env = {**timing_env(), **(env or {})}
        started = []
        for _ in range(count):
            name = f"{self.queue}-{len(self.workers) + 1}"
            worker = Worker(name, self.log_dir, concurrency=concurrency, extra_env=env, queues=self.queue)
            self.workers.append(worker)
            started.append(worker.launch())
        return [worker.wait_ready() for worker in started]  # started at once, not one after another

    def owner_of(self, pool_pid: int) -> Worker:
        from testproject.servers import parent_pid

        parent = parent_pid(pool_pid)
        return next(w for w in self.workers if w.process and w.process.pid == parent)

    def kill(self) -> None:
        for worker in self.workers:
            worker.kill()


@pytest.fixture
def chaos(redis_server, gate_redis, request):
    queue = f"chaos-{request.node.name[:40]}-{uuid.uuid4().hex[:6]}"
    harness = Chaos(queue, Path(os.environ["TESTPROJECT_DATA_DIR"]) / "logs")
    with override_settings(**{f"KEYED_QUEUE_{name}": value for name, value in TIMINGS.items()}):
        try:
            yield harness
        finally:
            harness.kill()
