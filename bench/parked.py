"""A deep key: Redis bytes per parked task, and submit latency with 100k tasks parked behind one key.

    python -m bench.parked [--parked 100000 --samples 2000]

Starts a broker and a gate redis-server in a temp dir (no workers). One key is paused and its
queue filled with real task messages (a demo ``step`` submitted through ``apply_async``, copied
with fresh task ids). Prints:

- Redis bytes per parked task (``used_memory`` growth / tasks), with short and with 1 KB
  arguments, and what the index of recent task ids adds while they are recent (it expires on
  its own within 30-60 s);
- gate submit latency (one parked submit) and the retried submit's lookup (a submission whose
  reply was lost), on an empty key and behind 100k parked tasks: p50 / p99 and the ratio;
- ``apply_async`` end to end (gate + record) on an empty key and behind the deep key;
- the live page's read of the deep key against a read of its whole queue.

Ratios are against the same call on an empty key in the same run: what depth costs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from collections.abc import Callable

from django_keyed_queue.gate import Submission

from .harness import Cluster, StoredMessage
from .stats import median, percentile

QUEUE = "bench-parked"


def p50_p99(samples: list[float]) -> tuple[float, float]:
    return median(samples), percentile(samples, 99)


def timed(call: Callable[[int], object], count: int) -> list[float]:
    """Microseconds per call, one call at a time."""
    out = []
    for i in range(count):
        t0 = time.perf_counter()
        call(i)
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def paired(empty: Callable[[int], object], deep: Callable[[int], object], count: int) -> tuple[list, list]:
    """Both calls timed in turns, so that the machine's drift weighs on both alike."""
    pairs = [(timed(empty, 1)[0], timed(deep, 1)[0]) for _ in range(count)]
    return [a for a, _ in pairs], [b for _, b in pairs]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parked", type=int, default=100_000, help="tasks parked behind the deep key")
    parser.add_argument("--samples", type=int, default=2000, help="calls timed per figure")
    args = parser.parse_args(argv)

    cluster = Cluster(workers=0, concurrency=1)
    try:
        cluster.start()
        from django_keyed_queue.gate.keys import KeyNames
        from django_keyed_queue.process.state import get_gate
        from testproject.demo.tasks import step

        gate = get_gate()
        client = gate.client

        def park(key: str, stored: StoredMessage, count: int) -> None:
            """``count`` more copies of ``stored`` behind ``key``, each with its own task id."""
            for _ in range(count):
                task_id, copy = stored.copy()
                gate.submit(Submission(key, copy, task_id=task_id))

        def bytes_per_task(key: str, n: object, count: int) -> tuple[float, float, int]:
            before = client.info("memory")["used_memory"]
            stored = StoredMessage(gate, key, n, QUEUE)
            park(key, stored, count - 1)
            grown = client.info("memory")["used_memory"] - before
            names = KeyNames(key)
            index = sum(client.memory_usage(name) or 0 for name in (names.recent, names.recent_older))
            return (grown - index) / count, index / count, len(stored.message)

        print(f"Redis {client.info('server')['redis_version']}, {args.parked} tasks parked behind one key")
        small, index, size = bytes_per_task("deep", 1, args.parked)
        large, _, large_size = bytes_per_task("deep-1k", "x" * 1000, min(args.parked, 20_000))
        print("Redis bytes per parked task (used_memory growth / tasks):")
        print(f"  message of {size} bytes (step('deep', 1)): {small:.0f}")
        print(f"  message of {large_size} bytes (a 1000-character argument): {large:.0f}")
        print(f"  the index of recent task ids, while they are recent: {index:.0f} more")

        deep_message = client.hget(KeyNames("deep").messages, 1)
        stored = client.hget(KeyNames("deep").messages, args.parked // 2)
        middle_id = json.loads(stored)["id"]

        def submit_on(key: str) -> Callable[[int], object]:
            def call(_: int) -> object:
                task_id = str(uuid.uuid4())
                return gate.submit(Submission(key, deep_message, task_id=task_id))

            return call

        gate.pause("shallow")
        figures = {}
        figures["submit, parked"] = paired(submit_on("shallow"), submit_on("deep"), args.samples)
        shallow_message = client.hget(KeyNames("shallow").messages, 1)
        shallow_id = json.loads(shallow_message)["id"]
        figures["retried submit (lookup)"] = paired(
            lambda _: gate.submit(Submission("shallow", shallow_message, task_id=shallow_id), retried=True),
            lambda _: gate.submit(Submission("deep", stored, task_id=middle_id), retried=True),
            args.samples,
        )
        gate.pause("shallow-2")
        figures["apply_async, parked (gate + record)"] = paired(
            lambda i: step.apply_async(("shallow-2", i), queue=QUEUE),
            lambda i: step.apply_async(("deep", i), queue=QUEUE),
            args.samples // 4,
        )
        figures["live page read of the key"] = paired(
            lambda _: gate.inspect_many(["shallow"], waiting_shown=0),
            lambda _: gate.inspect_many(["deep"], waiting_shown=0),
            200,
        )
        whole = p50_p99(timed(lambda _: gate.inspect("deep"), 20))

        print(f"latency in µs, p50 / p99, {args.samples} calls of each, in turns (apply_async: a quarter):")
        print(f"  {'call':36} {'empty key':>17} {'deep key':>17} {'ratio p50':>9}")
        for name, (empty, deep) in figures.items():
            e50, e99 = p50_p99(empty)
            d50, d99 = p50_p99(deep)
            print(f"  {name:36} {e50:8.0f} / {e99:6.0f} {d50:8.0f} / {d99:6.0f} {d50 / e50:9.2f}")
        print(f"  reading the deep key's whole queue instead: {whole[0]:.0f} µs p50")
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
