"""Submissions, reaper passes and WAIT at scale: one redis-server, a local 3-master Redis Cluster, Sentinel.

    python -m bench.topologies [--keys 1000000 --processes 2 --skip-cluster --skip-wait]

Each gate is made as the app makes it (``connect(url, cluster=...)``, lease 60 s, dispatch timeout
300 s). On one redis-server, then on a Redis Cluster of 3 masters (``testproject.topologies``):

1. Fill ``--keys`` distinct keys (``acct:0`` ...), one submission each (a ~100-byte message and a
   task id), with ``submit_many`` in batches of 500 from ``--processes`` spawned processes, each
   with its own client: submissions/s over the whole fill, and ``used_memory`` growth per key
   (summed over the masters) just after it. Then single ``submit`` calls (one round trip each) on
   fresh keys from as many processes for ``--seconds``: calls/s, p50 and p99 latency.
2. Every key now holds a granted ticket. ``reap()`` is timed with nothing due (median of 20
   passes); then ``--due`` keys are made due and ``reap(batch=500)`` runs until nothing is:
   seconds, passes, recoveries/s, and a check that each was recovered exactly once and no other.

Why step 2 moves more than index scores. A submission indexes its key 59 s ahead (the earliest a
new holder's deadline can fall, less 1 s), and the reaper looks again at least once a minute while
a key has holders: a minute after the fill every key is due for a visit that recovers nothing. So
every index score is first moved an hour ahead (how many were due is printed). And a zero score
alone only brings a visit (timed too, as keys visited/s): reap recovers a holder whose own deadline,
in its record, passed; the due keys have both moved to the past.

3. WAIT (``KEYED_QUEUE_REDIS_WAIT_REPLICAS``): on a Sentinel set (1 master, 1 replica), a gate with
   ``wait_replicas=0`` and one with 1, alternating, 3 rounds each of ``--wait-seconds`` of full task
   cycles (submit, start, finish on distinct keys) in this process: cycles/s, p50/p99 of each call,
   and the ratio; then the same on one redis-server without replicas (wait 0), for reference.
"""

from __future__ import annotations

import argparse
import multiprocessing
import queue
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from django_keyed_queue.gate import Finish, Gate, RecoveryAction, Start, Submission
from django_keyed_queue.gate.clients import connect
from django_keyed_queue.gate.keys import KeyNames
from testproject.servers import RedisServer, free_port
from testproject.topologies import LocalCluster, LocalSentinel

from .stats import median, percentile

BATCH = 500
FULL_KEYS = 1_000_000
# Moves every member of a deadline-index shard to ARGV[1], 1000 a ZADD (Lua's unpack has a stack limit).
PARK = """
local members = redis.call('ZRANGE', KEYS[1], 0, -1)
for i = 1, #members, 1000 do
  local args = {}
  for j = i, math.min(i + 999, #members) do args[#args + 1] = ARGV[1]; args[#args + 1] = members[j] end
  redis.call('ZADD', KEYS[1], unpack(args))
end
return #members
"""


def make_gate(url: str, cluster: bool = False, *, wait_replicas: int = 0, master: str | None = None) -> Gate:
    client = connect(url, cluster=cluster, sentinel_master=master)
    return Gate(client, lease_seconds=60, dispatch_timeout_seconds=300, wait_replicas=wait_replicas)


def message() -> tuple[str, bytes]:
    """A task id and a ~100-byte message carrying it (start checks a message's "id" is its ticket's)."""
    tid = str(uuid.uuid4())
    return tid, b'{"id": "%s", "task": "shop.tasks.sync_account", "args": ["acct", 1], "kwargs": {}}' % tid.encode()


def submission(key: str) -> Submission:
    tid, body = message()
    return Submission(key, body, tid)


def warm(gate: Gate, name: str) -> None:
    """Connect and load the script before any clock starts."""
    tid, body = message()
    gate.submit(Submission(f"warm:{name}", body, task_id=tid))


def fill(url: str, cluster: bool, first: int, stop: int, barrier: Any, results: Any) -> None:
    gate = make_gate(url, cluster)
    warm(gate, f"fill-{first}")
    barrier.wait(timeout=120)
    granted = 0
    for start in range(first, stop, BATCH):
        batch = range(start, min(start + BATCH, stop))
        replies = gate.submit_many([submission(f"acct:{i}") for i in batch])
        granted += sum(1 for r in replies if getattr(r, "granted", False))
    results.put(granted)


def submit_calls(url: str, cluster: bool, name: str, seconds: float, barrier: Any, results: Any) -> None:
    gate = make_gate(url, cluster)
    warm(gate, name)
    barrier.wait(timeout=120)
    latencies: list[float] = []
    t0 = time.perf_counter()
    while (began := time.perf_counter()) < t0 + seconds:
        tid, body = message()
        gate.submit(Submission(f"fresh:{name}:{len(latencies)}", body, task_id=tid))
        latencies.append(time.perf_counter() - began)
    results.put((len(latencies) / (time.perf_counter() - t0), latencies))


def in_processes(target: Callable[..., None], jobs: list[tuple[Any, ...]]) -> tuple[float, list[Any]]:
    """Run ``target(*job, barrier, results)`` in a spawned process per job; seconds from the common start
    (after each connected) to the last result, and the results."""
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(len(jobs) + 1), ctx.Queue()
    processes = [ctx.Process(target=target, args=(*job, barrier, results)) for job in jobs]
    for p in processes:
        p.start()
    try:
        barrier.wait(timeout=120)
        t0, got = time.perf_counter(), []
        while len(got) < len(jobs):
            try:
                got.append(results.get(timeout=1))
            except queue.Empty:
                if any(p.exitcode not in (None, 0) for p in processes):
                    raise RuntimeError("a benchmark process failed (its traceback is above)") from None
        return time.perf_counter() - t0, got
    finally:
        for p in processes:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()


def used_memory(ports: list[int]) -> int:
    total = 0
    for port in ports:
        with redis.Redis(port=port) as client:
            total += int(client.info("memory")["used_memory"])
    return total


def ms(seconds: float) -> float:
    return seconds * 1000


def figure(value: float) -> str:
    return f"{value:,.{2 if isinstance(value, float) and value < 100 else 0}f}"


def row(what: str, value: float, unit: str, note: str = "") -> None:
    print(f"  {what:46} {figure(value):>12} {unit:15} {note}".rstrip())


def at_scale(label: str, url: str, cluster: bool, ports: list[int], args: argparse.Namespace) -> dict[str, Any]:
    """Steps 1 and 2 on one topology; its headline figures."""
    n, p = args.keys, args.processes
    print(f"\n== {label}: {n:,} keys, {p} producer processes ==", flush=True)
    before = used_memory(ports)
    bounds = [n * i // p for i in range(p + 1)]
    elapsed, granted = in_processes(fill, [(url, cluster, bounds[i], bounds[i + 1]) for i in range(p)])
    used = used_memory(ports) - before
    out = {"fill": n / elapsed, "bytes": used / n}
    row(f"fill, submit_many x {BATCH}", n / elapsed, "submissions/s", f"{elapsed:.1f} s, {sum(granted):,} granted")
    row("Redis used_memory growth after the fill", used / n, "bytes/key", f"{used / 2**20:,.0f} MiB in all")
    _, calls = in_processes(submit_calls, [(url, cluster, f"p{i}", args.seconds) for i in range(p)])
    latencies = [s for _, run in calls for s in run]
    out["calls"], out["p50"], out["p99"] = sum(r for r, _ in calls), *(ms(percentile(latencies, q)) for q in (50, 99))
    row(f"single submit calls, {args.seconds:g} s, {p} processes", out["calls"], "calls/s")
    row("  latency p50", out["p50"], "ms")
    row("  latency p99", out["p99"], "ms")

    gate = make_gate(url, cluster)
    now_ms, shards = int(time.time() * 1000), gate.deadlines.names
    naturally_due = sum(int(gate.client.zcount(s, "-inf", now_ms)) for s in shards)
    indexed = sum(int(gate.client.eval(PARK, 1, s, now_ms + 3_600_000)) for s in shards)
    row("index entries due now (their 59 s hint passed)", naturally_due, "keys", f"of {indexed:,}; all moved 1 h ahead")
    idle = []
    for _ in range(20):
        t0 = time.perf_counter()
        visited, _ = gate.reap()
        idle.append(time.perf_counter() - t0)
        assert visited == 0, f"{visited} keys due after the index was moved ahead"
    out["idle"] = ms(median(idle))
    row("reap(), nothing due, median of 20", out["idle"], "ms/pass", f"{len(shards)} index shard(s)")

    due = [f"acct:{i}" for i in range(0, n, max(1, n // args.due))][: args.due]
    make_due(gate, due, holders=False)
    took, passes, recovered, _ = drain(gate)
    out["visits"] = len(due) / took
    note = f"{took:.2f} s, {passes} passes, {sum(recovered.values())} recoveries"
    row(f"reap(batch=500), {len(due):,} index scores at 0", out["visits"], "keys visited/s", note)
    make_due(gate, due)
    took, passes, recovered, actions = drain(gate)
    out["recoveries"] = sum(recovered.values()) / took
    note = f"{took:.2f} s, {passes} passes"
    row(f"reap(batch=500), {len(due):,} holders due", out["recoveries"], "recoveries/s", note)
    twice, missed = sum(c > 1 for c in recovered.values()), len(set(due) - set(recovered))
    others = len(set(recovered) - set(due))
    out["ok"] = twice == missed == others == 0 and actions == {str(RecoveryAction.REPUBLISH): len(due)}
    verdict = f"twice {twice}, missed {missed}, other keys {others}; actions {dict(actions)}"
    print(f"  each due key recovered exactly once: {'yes' if out['ok'] else 'NO'} ({verdict})")
    return out


def make_due(gate: Gate, keys: list[str], *, holders: bool = True) -> None:
    """Score each key 0 in the deadline index and, with ``holders``, move its holder's deadline
    (ticket 1, from the fill) to the past."""
    pipe = gate.client.pipeline(transaction=False)
    for key in keys if holders else ():
        pipe.hget(KeyNames(key).holders, "1")
    records = pipe.execute() if holders else [None] * len(keys)
    pipe = gate.client.pipeline(transaction=False)
    for key, record in zip(keys, records, strict=True):
        if record is not None:
            fields = record.split(b"|")  # "<state>|<dispatch>|<token>|<deadline_ms>|..."
            fields[3] = b"1"
            pipe.hset(KeyNames(key).holders, "1", b"|".join(fields))
        pipe.zadd(gate.deadlines.shard_of(key), {key: 0})
    pipe.execute()


def drain(gate: Gate) -> tuple[float, int, Counter[str], Counter[str]]:
    """``reap(batch=500)`` until nothing is due: seconds, passes (the last, empty, not counted), and the
    recoveries by key and by action."""
    recovered: Counter[str] = Counter()
    actions: Counter[str] = Counter()
    passes, t0 = 0, time.perf_counter()
    while True:
        visited, recoveries = gate.reap(batch=500)
        if not visited:
            return time.perf_counter() - t0, passes, recovered, actions
        passes += 1
        recovered.update(r.key for r in recoveries)
        actions.update(str(r.action) for r in recoveries)


CALLS = ("submit", "start", "finish")
HEADLINES = [
    ("fill, submissions/s", "fill"),
    ("single submit, calls/s", "calls"),
    ("single submit, p50 ms", "p50"),
    ("single submit, p99 ms", "p99"),
    ("used_memory, bytes/key", "bytes"),
    ("reap() with nothing due, ms/pass", "idle"),
    ("reap, recoveries/s", "recoveries"),
    ("reap, visits that recover nothing, keys/s", "visits"),
]


def cycles(gate: Gate, seconds: float, tag: str, into: dict[str, list[float]]) -> int:
    """Full task cycles on distinct keys for ``seconds``; each call's latency appended to ``into``."""
    count, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        key, (tid, body) = f"cycle:{tag}:{count}", message()
        t0 = time.perf_counter()
        submitted = gate.submit(Submission(key, body, task_id=tid))
        t1 = time.perf_counter()
        assert submitted is not None and submitted.granted
        started = gate.start(Start(key, submitted.ticket, 1, task_id=tid))
        t2 = time.perf_counter()
        assert started.ok, started
        gate.finish(Finish(key, submitted.ticket, started.token))
        t3 = time.perf_counter()
        for name, took in zip(CALLS, (t1 - t0, t2 - t1, t3 - t2), strict=True):
            into[name].append(took)
        count += 1
    return count


def wait_cost(directory: Path, args: argparse.Namespace) -> dict[str, float]:
    print(f"\n== WAIT: 1 process, full task cycles, 3 rounds of {args.wait_seconds:g} s each ==", flush=True)
    rows: dict[str, tuple[float, dict[str, list[float]]]] = {}

    def run(label: str, gates: dict[str, Gate]) -> None:
        for name, gate in gates.items():
            warm(gate, name)
        done = {name: 0 for name in gates}
        lat: dict[str, dict[str, list[float]]] = {name: {c: [] for c in CALLS} for name in gates}
        for r in range(3):
            for name, gate in gates.items():  # alternating, so a drift of the machine hits both
                done[name] += cycles(gate, args.wait_seconds, f"{name}-{r}", lat[name])
        for name in gates:
            rows[f"{label}, {name}"] = (done[name] / (3 * args.wait_seconds), lat[name])

    with LocalSentinel(directory / "sentinel") as sentinel:
        url, master = sentinel.url, sentinel.master_name
        run("Sentinel", {f"wait {w}": make_gate(url, wait_replicas=w, master=master) for w in (0, 1)})
    server = RedisServer(f"redis://127.0.0.1:{free_port()}", directory / "reference")
    try:
        server.start()
        run("one server, no replica", {"wait 0": make_gate(server.url)})
    finally:
        server.stop()
    print(f"  {'set-up':30} {'cycles/s':>9}" + "".join(f" {c + ' p50/p99 ms':>22}" for c in CALLS))
    for label, (rate, lat) in rows.items():
        cells = "".join(f" {ms(percentile(lat[c], 50)):10.3f} /{ms(percentile(lat[c], 99)):8.3f}  " for c in CALLS)
        print(f"  {label:30} {rate:9,.0f}{cells}")
    (without, lat0), (with_, lat1) = rows["Sentinel, wait 0"], rows["Sentinel, wait 1"]
    p50s = ", ".join(f"{c} {percentile(lat1[c], 50) / percentile(lat0[c], 50):.2f}x" for c in CALLS)
    print(f"  with WAIT 1 / without: cycles/s {with_ / without:.2f}x; p50 latency {p50s}")
    return {"without": without, "with": with_, "reference": rows["one server, no replica, wait 0"][0]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=FULL_KEYS)
    parser.add_argument("--processes", type=int, default=2, help="producer processes")
    parser.add_argument("--due", type=int, default=10_000, help="keys made due for the reaper")
    parser.add_argument("--seconds", type=float, help="of single submit calls (default 10; 2 below 1M keys)")
    parser.add_argument("--wait-seconds", type=float, help="per WAIT round (default 5; 1 below 1M keys)")
    parser.add_argument("--skip-cluster", action="store_true")
    parser.add_argument("--skip-wait", action="store_true")
    args = parser.parse_args(argv)
    full = args.keys >= FULL_KEYS
    args.seconds = args.seconds or (10.0 if full else 2.0)
    args.wait_seconds = args.wait_seconds or (5.0 if full else 1.0)
    args.due = min(args.due, args.keys)

    began = time.perf_counter()
    summary: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="keyed-queue-topologies-") as tmp:
        directory = Path(tmp)
        server = RedisServer(f"redis://127.0.0.1:{free_port()}", directory / "single")
        try:
            server.start()
            with redis.Redis(port=server.port) as client:
                print(f"Redis {client.info('server')['redis_version']}, messages of {len(message()[1])} bytes")
            assert server.port is not None
            summary["one redis-server"] = at_scale("one redis-server", server.url, False, [server.port], args)
        finally:
            server.stop()  # frees its memory before the cluster fills
        if not args.skip_cluster:
            with LocalCluster(directory / "cluster") as cluster:
                ports = [m.port for m in cluster.masters() if m.port is not None]
                summary["3-master cluster"] = at_scale("3-master cluster", cluster.url, True, ports, args)
        wait = None if args.skip_wait else wait_cost(directory, args)

    took = time.perf_counter() - began
    print(f"\n== Summary: {args.keys:,} keys, {args.processes} producers, {took:.0f} s in all ==")
    if summary:
        print(f"  {'':40}" + "".join(f"{label:>18}" for label in summary))
        for what, name in HEADLINES:
            print(f"  {what:40}" + "".join(f"{figure(s[name]):>18}" for s in summary.values()))
        print(
            f"  {'each due key recovered exactly once':40}"
            + "".join(f"{'yes' if s['ok'] else 'NO':>18}" for s in summary.values())
        )
    if wait:
        print(
            f"  WAIT 1 on Sentinel: {wait['with']:,.0f} cycles/s vs {wait['without']:,.0f} without "
            f"({wait['with'] / wait['without']:.2f}x); one server, no replica: {wait['reference']:,.0f} cycles/s"
        )
    return 0 if all(s["ok"] for s in summary.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
