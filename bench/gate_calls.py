"""CPU per gate call, client and redis-server, against a PING and a trivial script on the same connection.

    python -m bench.gate_calls [--calls 10000 --rounds 3]

Starts a gate redis-server in a temp dir (no workers) and times, one call at a time with nothing
else running: PING, a script that returns 1, the three calls every keyed task makes (submit of
a free key, start, finish with an outcome), a pool's own two calls, in a pooled task's order:
``pool_acquire`` before start and ``pool_release`` after finish (where its pool is apart: a Redis Cluster),
and the three calls of a pooled task on one server, whose start and finish ask the pool themselves. The pool
has room for every call's ticket (each kind runs over all of a round's keys before the next: it holds
up to ``--calls`` slots at once), so each acquire gets a slot and each release frees one no ticket
waits for. Client CPU is this process's ``time.process_time()``; server CPU is the redis-server's user
+ system time from ``/proc``. Prints the best round of each. The PING line is the floor of any round
trip on this machine. See docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from django_keyed_queue.gate import Finish, Start, Submission

from .harness import Cluster, cpu_seconds

# A stored task message as the producer writes it (compact, its name and id first), about the size of one
# with three short arguments and Celery's headers; start checks its task id.
MESSAGE = json.dumps(
    {"task": "shop.tasks.step", "id": "0" * 36, "content_type": "application/json", "encoding": "utf-8",
     "body": "m" * 1800},
    separators=(",", ":"),
).encode()  # fmt: skip
OUTCOME = b"o" * 200  # about the size of a run's outcome record
#: The calls of every keyed task, and the pool's own, which a pooled task makes besides where its pool is apart.
KEYED = ("submit (free key, granted)", "start", "finish (with outcome)")
POOLED = ("pool_acquire (room)", "pool_release")
POOLED_HERE = ("submit, pooled key", "start, pool in it", "finish, pool in it")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=10000, help="calls per kind and round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)

    cluster = Cluster(workers=0, concurrency=1)
    try:
        cluster.start()
        from django_keyed_queue.gate import Outcome, Pool
        from django_keyed_queue.process.state import get_gate

        gate = get_gate()
        server = {"gate redis": [cluster.servers[1].process.pid]}
        trivial = gate.client.register_script("return 1")
        best: dict[str, tuple[float, float]] = {}
        tokens: dict[str, int] = {}  # key -> the token its start returned, for its finish
        roomy = Pool("roomy", limit=args.calls, interval_ms=0)

        def accepted(ok: bool, call: str, key: str) -> None:
            if not ok:  # a refused call returns early: its time is not the call's
                raise RuntimeError(f"{call} of {key} refused")

        def start(key: str, pool: Pool | None = None) -> None:
            started = gate.start(
                Start(key, 1, 1, task_id="0" * 36, pool=pool)
            )  # a granted ticket's first dispatch is 1
            accepted(started.ok, "start", key)
            tokens[key] = started.token

        def finish(key: str, pool: str | None = None) -> None:
            accepted(
                gate.finish(Finish(key, 1, tokens[key], outcome=Outcome(key, OUTCOME), pool=pool)).ok, "finish", key
            )

        kinds = {  # in a pooled task's order: its worker asks the pool before start, gives back after finish
            "PING": lambda key: gate.client.ping(),
            "script returning 1": lambda key: trivial(),
            "submit (free key, granted)": lambda key: accepted(
                gate.submit(Submission(key, MESSAGE, task_id=key)).granted, "submit", key
            ),
            "pool_acquire (room)": lambda key: accepted(gate.pool_acquire(roomy, key, 1).ok, "pool_acquire", key),
            "start": start,
            "finish (with outcome)": finish,
            "pool_release": lambda key: gate.pool_release(roomy.name, [(key, 1)]),
            # On one server a pooled task's start and finish ask and give back in their own call.
            "submit, pooled key": lambda key: accepted(
                gate.submit(Submission(f"p{key}", MESSAGE, task_id=key)).granted, "submit", key
            ),
            "start, pool in it": lambda key: start(f"p{key}", roomy),
            "finish, pool in it": lambda key: finish(f"p{key}", roomy.name),
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
        keyed, pool, here = (sum(sum(best[name]) for name in names) for names in (KEYED, POOLED, POOLED_HERE))
        print(f"one keyed task's three gate calls: {keyed:.0f} µs")
        rows = (("apart (a Redis Cluster)", "two calls", pool), ("on the keys' server", "no call", here - keyed))
        for where, calls, more in rows:
            print(f"a pooled task, its pool {where}: {calls} more, {more:.0f} µs (+{100 * more / keyed:.0f}%)")
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
