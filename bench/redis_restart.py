"""Plain Celery against keyed tasks when the one Redis of a user's project is SIGKILLed and restarted mid-run.

    python -m bench.redis_restart [--rounds 2 --settings defaults|recommended --keep]

Each round runs ``plain_step`` then ``step`` (the other way round in even rounds), each in a fresh project
made as a user makes one (testproject/userproject/project.py: ``django-admin startproject``, Celery's
documented layout, the default SQLite) with a fresh redis-server for both broker and gate, persistent as a broker should
be (``--appendonly yes --appendfsync always``), ``KEYED_QUEUE_LEASE_SECONDS = 3`` and two workers (prefork,
concurrency 2). A producer submits 144 tasks of 0.12 s over 12 keys, one every 0.02 s, and submits again
what Redis refused. After 30 starts the redis-server is SIGKILLed, and started again 1 s later on the same
port and directory. Counted within 60 s of the restart: the accepted tasks that ran (an ``end`` line),
those that started twice, the workers still alive, and the seconds from Redis answering again to each key's
first start. ``--settings recommended`` adds the README's ``CELERY_WORKER_PREFETCH_MULTIPLIER = 1`` and
``CELERY_TASK_ACKS_LATE = True``. Exits 1 if a keyed run lost or repeated a task or lost a worker.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from testproject.history_checks import start_counts
from testproject.servers import AOF_ALWAYS, RedisServer, free_port
from testproject.userproject.project import UserProject

from .harness import wait_for
from .stats import median

TASKS, KEYS, INTERVAL, SECONDS = 144, 12, 0.02, 0.12
STARTS_BEFORE_KILL, DOWN_SECONDS, WINDOW_SECONDS = 30, 1.0, 60.0
KINDS = ("plain_step", "step")
SETTINGS = {
    "defaults": {},
    "recommended": {"CELERY_WORKER_PREFETCH_MULTIPLIER": 1, "CELERY_TASK_ACKS_LATE": True},
}


@dataclass
class Result:
    kind: str
    accepted: int = 0
    ran: int = 0  # accepted tasks with an end line within the window
    twice: int = 0  # accepted tasks with more than one start line
    workers_alive: int = 0
    workers: int = 0
    #: Per key, seconds from Redis answering again to the key's first start.
    resumes: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0  # wall time of the run, build included

    @property
    def ok(self) -> bool:
        return self.ran == self.accepted and not self.twice and self.workers_alive == self.workers


def run(kind: str, settings: dict, directory: Path) -> Result:
    """One fresh Redis and project, one Redis restart under a producer; what ran in the window after it."""
    began = time.monotonic()
    server = RedisServer(f"redis://127.0.0.1:{free_port()}", directory / "redis")
    project = UserProject(directory / "mysite", server.url, {"KEYED_QUEUE_LEASE_SECONDS": 3, **settings})
    producer = None
    try:
        server.start(*AOF_ALWAYS)
        project.build()
        project.worker("a")
        project.worker("b")
        producer = project.produce(kind, TASKS, KEYS, INTERVAL, SECONDS)
        if not wait_for(lambda: sum(e["event"] == "start" for e in project.history()) >= STARTS_BEFORE_KILL, 30):
            raise RuntimeError(f"{kind}: fewer than {STARTS_BEFORE_KILL} starts in 30 s; see {directory}/mysite/logs")
        server.process.kill()
        server.process.wait(10)
        time.sleep(DOWN_SECONDS)
        server.start(*AOF_ALWAYS)
        back = time.time()
        try:  # the producer submits again what Redis refused, so it ends soon after Redis is back
            out, _ = producer.communicate(timeout=WINDOW_SECONDS)
        except subprocess.TimeoutExpired:
            producer.kill()
            out, _ = producer.communicate()
        accepted = {json.loads(line)["id"] for line in out.splitlines()}
        until = back + WINDOW_SECONDS
        wait_for(lambda: accepted <= project.ended(until), until - time.time())
        history = project.history()
        starts = start_counts(history, accepted)
        result = Result(kind, len(accepted), len(accepted & project.ended(until)), sum(n > 1 for n in starts.values()))
        result.workers = len(project.workers)
        result.workers_alive = sum(w.process.poll() is None for w in project.workers)
        for e in history:
            if e["event"] == "start" and e["t"] >= back:
                result.resumes.setdefault(e["key"], e["t"] - back)
        result.seconds = time.monotonic() - began
        return result
    finally:
        if producer is not None and producer.poll() is None:
            producer.kill()
            producer.wait()
        project.kill()
        server.stop()


def line(index: int, rounds: int, r: Result) -> str:
    resume = f"max {max(r.resumes.values()):.2f} s" if r.resumes else "-"
    return (
        f"round {index}/{rounds} {r.kind:<10} accepted {r.accepted}, ran {r.ran} within {WINDOW_SECONDS:.0f} s "
        f"({r.accepted - r.ran} not), ran twice {r.twice}, workers alive {r.workers_alive}/{r.workers}, "
        f"keys resumed {len(r.resumes)}/{KEYS} {resume}; {r.seconds:.0f} s"
    )


def print_summary(results: list[Result], settings: str, rounds: int) -> None:
    print(
        f"\n== Redis SIGKILLed and restarted after {STARTS_BEFORE_KILL} starts: settings {settings}, {rounds} rounds =="
    )
    print(
        f"{'kind':<10} {'runs':>4} {'accepted':>8} {'ran in 60 s':>11} {'not run':>7} {'ran twice':>9} "
        f"{'workers alive':>13}  resume max (s) median / worst"
    )
    for kind in KINDS:
        mine = [r for r in results if r.kind == kind]
        if not mine:
            continue
        worst = [max(r.resumes.values()) for r in mine if r.resumes]
        resume = f"{median(worst):.2f} / {max(worst):.2f}" if worst else "-"
        accepted, ran = sum(r.accepted for r in mine), sum(r.ran for r in mine)
        alive = f"{sum(r.workers_alive for r in mine)}/{sum(r.workers for r in mine)}"
        twice = sum(r.twice for r in mine)
        print(f"{kind:<10} {len(mine):>4} {accepted:>8} {ran:>11} {accepted - ran:>7} {twice:>9} {alive:>13}  {resume}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--settings", choices=sorted(SETTINGS), default="defaults")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (worker logs, history, Redis)")
    args = parser.parse_args(argv)

    base = Path(tempfile.mkdtemp(prefix="keyed-queue-redis-restart-"))
    results: list[Result] = []
    try:
        for index in range(1, args.rounds + 1):
            for kind in KINDS if index % 2 else KINDS[::-1]:  # alternate which kind runs first
                result = run(kind, SETTINGS[args.settings], base / f"round{index}-{kind}")
                results.append(result)
                print(line(index, args.rounds, result), flush=True)
    finally:
        if args.keep:
            print(f"kept {base}", file=sys.stderr)
        else:
            shutil.rmtree(base, ignore_errors=True)
    print_summary(results, args.settings, args.rounds)
    return 0 if all(r.ok for r in results if r.kind == "step") else 1


if __name__ == "__main__":
    sys.exit(main())
