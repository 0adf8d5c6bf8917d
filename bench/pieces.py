"""CPU per task of each piece of a keyed task's path, one at a time, in this process (no workers).

    python -m bench.pieces [--tasks 2000] [--database sqlite|sqlite-wal|postgresql] [--key-separator :]

Starts one redis-server (broker and gate) and the records' database in a temp dir, then runs each
piece ``--tasks`` times on as many keys, in the order a task meets them, and prints the client's
CPU time (``time.process_time``), the redis-server's CPU time (from /proc, tick-grained: about
0.003 ms a task at 3,000 tasks) and the wall time, per task. PostgreSQL's own CPU is not in these
figures. Where the keyed path's cost over plain Celery goes, piece by piece (see docs/benchmarks.md).
Keys are ``k0``, ``k1``, ...; ``--key-separator :`` makes them ``k:0``, ``k:1``, ..., each with a word
after its first that the records' writer writes for the admin's search (a new key every task: the
most those writes cost).
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections.abc import Callable
from types import SimpleNamespace

from django_keyed_queue.gate import Finish, Start, Submission

from .harness import DATABASES, Cluster, cpu_seconds

#: A stored message of about the size of the demo ``step``'s.
MESSAGE = b"x" * 1500


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--database", choices=DATABASES, default="sqlite")
    parser.add_argument("--key-separator", default="", help="between k and the number: '' (default) or ':'")
    args = parser.parse_args(argv)
    n = args.tasks
    keys = [f"k{args.key_separator}{i}" for i in range(n)]

    cluster = Cluster(workers=0, concurrency=1, database=args.database, gate_on_broker=True)
    try:
        cluster.start()
        from django.utils import timezone

        from django_keyed_queue.gate import Outcome
        from django_keyed_queue.process.state import get_gate
        from django_keyed_queue.process.totals import Totals
        from django_keyed_queue.records import submissions
        from django_keyed_queue.records.models import KeyedTask
        from django_keyed_queue.records.transitions import Transition

        gate = get_gate()
        ids = [str(uuid.uuid4()) for _ in range(n)]
        tokens: dict[int, int] = {}
        ends: list[Transition] = []
        print(f"{n} tasks on {n} keys ({keys[0]}, {keys[1]}, ...), records in {args.database}, one redis-server")

        redis_pid = [server.process.pid for server in cluster.servers]

        def piece(label: str, run: Callable[[], object]) -> None:
            redis_cpu = cpu_seconds({"redis": redis_pid})["redis"]
            cpu, wall = time.process_time(), time.perf_counter()
            run()
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            redis_cpu = cpu_seconds({"redis": redis_pid})["redis"] - redis_cpu
            print(
                f"  {label:<58} {1e3 * cpu / n:6.3f} ms CPU  {1e3 * redis_cpu / n:6.3f} ms Redis CPU  "
                f"{1e3 * wall / n:6.3f} ms wall per task"
            )

        def submit() -> None:
            for i in range(n):
                record = submissions.encode_record(ids[i], "demo.step", f"args=('{keys[i]}', 1) kwargs={{}}")
                gate.submit(Submission(keys[i], MESSAGE, task_id=ids[i], record=record))

        def start() -> None:
            for i in range(n):
                tokens[i] = gate.start(Start(keys[i], 1, 1)).token

        def write_rows() -> None:
            # Past the record delay, a writer's pass visits each key its runs left: nothing is left to write.
            assert submissions.write_due(gate, batch=100, max_batches=n // 100 + 1) == 0
            assert not gate.claim_unwritten(claim_seconds=1, batch=1), "every key was visited"

        def build_end() -> None:
            now = timezone.now()
            for i in range(n):
                create = {"task_name": "demo.step", "enqueued_at": now, "args": (keys[i], 1), "kwargs": {}}
                fields = {"started_at": now, "heartbeat_at": now, "worker": "w1"}
                running = Transition(ids[i], keys[i], 1, "running", 1, fields, create=create)
                ends.append(running.merged_with(Transition(ids[i], keys[i], 1, "succeeded", 1, {"finished_at": now})))

        def finish() -> None:
            for i, end in enumerate(ends):
                finished = gate.finish(Finish(keys[i], 1, tokens[i], outcome=Outcome(end.outcome_field, end.to_json())))
                assert finished.unwritten is not None, "the run ended before its submission's row was written"
                ends[i] = submissions.ended_with_record(end, finished.unwritten)

        def apply_ends() -> None:
            for j in range(0, n, 50):
                KeyedTask.objects.apply(*ends[j : j + 50])

        def forget_outcomes() -> None:
            for j in range(0, n, 50):
                batch = ends[j : j + 50]
                gate.forget_outcomes([(t.key, t.outcome_field) for t in batch], records=[(t.key, 1) for t in batch])

        def count_for_metrics() -> None:
            counted, task = Totals(lambda: gate), SimpleNamespace(name="demo.step", serial_key="{key}")
            for i in range(n):
                counted.count("submitted", task)
                counted.count("started", task)
                counted.observe("wait_seconds", task, 0.004)
                counted.count("finished", task, outcome="succeeded")
                counted.observe("run_seconds", task, 0.02, outcome="succeeded")
                if i % 1000 == 999:  # a process adds its counts each second: about 1,000 tasks at this rate
                    counted.flush()
            counted.close()

        piece("producer: gate.submit with the record (one round trip)", submit)
        piece("worker: gate.start", start)
        piece("worker: the run's transitions, built and merged", build_end)
        piece("worker: gate.finish with the outcome, its record handed back", finish)
        piece("worker: the run's one row inserted, 50 rows a transaction", apply_ends)
        piece("worker: outcomes and records forgotten, 50 a round trip", forget_outcomes)
        piece("worker main process: a pass over the keys left, 100 a pass", write_rows)
        piece("producer and worker: a task's counts for the metrics, added every 1000", count_for_metrics)
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
