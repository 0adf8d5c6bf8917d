"""CPU per gate call, client and redis-server, against a PING and a trivial script on the same connection.

    python -m bench.gate_calls [--calls 10000 --rounds 3]

Starts a gate redis-server in a temp dir (no workers) and times, one call at a time with nothing
else running: PING, a script that returns 1, and the three calls every keyed task makes (submit of
a free key, start, finish with an outcome). Client CPU is this process's ``time.process_time()``;
server CPU is the redis-server's user + system time from ``/proc``. Prints the best round of each.
The PING line is the floor of any round trip on this machine. See docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from .harness import Cluster, cpu_seconds

# A stored task message as the producer writes it (compact, its name and id first), about the size of one
# with three short arguments and Celery's headers; start checks its task id.
MESSAGE = json.dumps(
    {"task": "shop.tasks.step", "id": "0" * 36, "content_type": "application/json", "encoding": "utf-8",
     "body": "m" * 1800},
    separators=(",", ":"),
).encode()  # fmt: skip
OUTCOME = b"o" * 200  # about the size of a run's outcome record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=10000, help="calls per kind and round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)

    cluster = Cluster(workers=0, concurrency=1)
    try:
        cluster.start()
        from django_keyed_queue.gate import Outcome
        from django_keyed_queue.process.state import get_gate

        gate = get_gate()
        server = {"gate redis": [cluster.servers[1].process.pid]}
        trivial = gate.client.register_script("return 1")
        best: dict[str, tuple[float, float]] = {}
        tokens: dict[str, int] = {}  # key -> the token its start returned, for its finish

        def start(key: str) -> None:
            tokens[key] = gate.start(key, 1, 0, task_id="0" * 36).token

        kinds = {
            "PING": lambda key: gate.client.ping(),
            "script returning 1": lambda key: trivial(),
            "submit (free key, granted)": lambda key: gate.submit(key, MESSAGE, task_id=key),
            "start": start,
            "finish (with outcome)": lambda key: gate.finish(key, 1, tokens[key], outcome=Outcome(key, OUTCOME)),
        }
        for r in range(args.rounds):
            keys = [f"bench-{r}-{i}" for i in range(args.calls)]
            for name, call in kinds.items():
                server0, client0 = cpu_seconds(server)["gate redis"], time.process_time()
                for key in keys:
                    call(key)
                client = (time.process_time() - client0) / args.calls * 1e6
                served = (cpu_seconds(server)["gate redis"] - server0) / args.calls * 1e6
                if name not in best or client + served < sum(best[name]):
                    best[name] = (client, served)

        print(f"µs of CPU per call, best of {args.rounds} rounds of {args.calls}:")
        print(f"  {'call':28} {'client':>7} {'server':>7} {'total':>7}")
        for name, (client, served) in best.items():
            print(f"  {name:28} {client:7.0f} {served:7.0f} {client + served:7.0f}")
        per_task = sum(sum(best[name]) for name in list(best)[2:])
        print(f"one keyed task's three gate calls: {per_task:.0f} µs")
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
