"""How soon a pool's freed slot runs the next task, against how soon a key's end runs its next task.

    python -m bench.pool_handoff [--tasks 120 --keys 40 --hot-tasks 60 --seconds 0.05 --keep]

One fresh project made as a user makes one (testproject/userproject/project.py: ``django-admin startproject``,
Celery's documented layout, the default SQLite, one redis-server for broker and gate) and two workers (prefork,
``-c 4``). Two producers, one after the other:

- the pool: ``--tasks`` of ``pooled_step`` (pool "three": three at once, whatever the key) over ``--keys``
  keys, each ``--seconds`` long, so that the pool is full and tasks wait for it. A pool handoff is the time
  from an end that freed a slot of the full pool to the next start of the pool's tasks;
- one key: ``--hot-tasks`` of ``step`` on one key, the same length. A key handoff is the time from the end
  of task n to the start of n+1 (local handoff included, as users run it).

Times are the tasks' own lines in the project's history, in the order they were written. Prints the p50 and
p99 of each, and the count. See docs/benchmarks.md, "Pools".
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from testproject.servers import RedisServer, free_port
from testproject.userproject.project import UserProject

from .harness import wait_for
from .stats import median, percentile

POOL, POOL_LIMIT = "three", 3


def pool_handoffs(history: list[dict], ids: set[str]) -> list[float]:
    """Seconds from each end that freed a slot of the full pool to the pool's next start."""
    running: set[str] = set()
    freed_at, handoffs = None, []
    for e in history:
        if e["id"] not in ids:
            continue
        if e["event"] == "end":
            if len(running) == POOL_LIMIT and freed_at is None:
                freed_at = e["t"]
            running.discard(e["id"])
        elif e["event"] == "start":
            if freed_at is not None:
                handoffs.append(e["t"] - freed_at)
                freed_at = None
            running.add(e["id"])
    return handoffs


def key_handoffs(history: list[dict], key: str) -> list[float]:
    """Seconds from the end of each task of ``key`` to the start of its next."""
    events = [e for e in history if e["key"] == key and e["event"] in ("start", "end")]
    return [
        b["t"] - a["t"]
        for a, b in zip(events, events[1:], strict=False)
        if (a["event"], b["event"]) == ("end", "start")
    ]


def run_all(project: UserProject, producer: subprocess.Popen, timeout: float = 120) -> set[str]:
    """Ids of the producer's accepted tasks, once every one of them ended (or exits if one did not in time)."""
    ids = {a["id"] for a in project.accepted(producer)}
    if not wait_for(lambda: ids <= project.ended(), timeout, 0.2):
        raise SystemExit(f"not every task ended within {timeout} s")
    return ids


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=120, help="pooled tasks")
    parser.add_argument("--keys", type=int, default=40, help="keys of the pooled tasks")
    parser.add_argument("--hot-tasks", type=int, default=60, help="tasks of the one key")
    parser.add_argument("--seconds", type=float, default=0.05, help="each task's length")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir")
    args = parser.parse_args(argv)
    directory = Path(tempfile.mkdtemp(prefix="bench-pool-handoff-"))
    server = RedisServer(f"redis://127.0.0.1:{free_port()}", directory / "redis")
    project = UserProject(directory / "mysite", server.url)
    try:
        server.start()
        project.build()
        project.worker("a", concurrency=4)
        project.worker("b", concurrency=4)
        pooling = project.produce("pooled_step", args.tasks, args.keys, 0, args.seconds, prefix="pooled")
        pooled = run_all(project, pooling)
        run_all(project, project.produce("step", args.hot_tasks, 1, 0, args.seconds, prefix="hot"))
        history = project.history()
        rows = (("pool 'three' (full)", pool_handoffs(history, pooled)), ("one key", key_handoffs(history, "hot:0")))
        print(f"{'handoff':20} {'count':>6} {'p50 ms':>8} {'p99 ms':>8}")
        for name, seconds in rows:
            ms = [1000 * s for s in seconds]
            print(f"{name:20} {len(ms):6d} {median(ms):8.1f} {percentile(ms, 99):8.1f}")
    finally:
        project.kill()
        server.stop()
        if args.keep:
            print(f"kept: {directory}")
        else:
            shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
