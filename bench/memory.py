"""Redis bytes per task and per key at many keys: dispatched, waiting, idle, and after the idle horizon.

    python -m bench.memory [--keys 100000 --horizon-keys 10000]

Starts a broker and a gate redis-server in a temp dir (no workers). Every task message is a real
stored message of the demo ``step`` as Celery builds it (submitted once through ``apply_async``,
then copied with fresh task ids), and every transition is the gate's own call. Over ``--keys``
keys, one after another:

- one task per key, granted (dispatched, not started): bytes per key with its task;
- a second task per key, which waits: bytes per waiting task;
- both run to their end (start, finish): bytes per idle key, then again once the index of
  recent task ids has expired (it does within 60 s), and once the reaper visited the keys;
- over ``--horizon-keys`` more keys, run to idle by a gate whose idle horizon is 2 s: what is
  left of an idle key once the horizon has passed and the reaper visited it;
- over ``--horizon-keys`` more keys, one task each with the record a producer keeps for its row,
  before and after the rows are written;
- first of all, one key of a ``coalesce=True`` task, one running, then ``--coalesce-submissions``
  more: the stored messages it holds, and its bytes with the superseded tasks' records kept for
  their rows and once the rows are written; beside it, the same submissions on a key that does
  not coalesce. ``--keys 0`` runs this part alone.

Each figure is ``used_memory`` growth divided by the count.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from django_keyed_queue.gate import Finish, Start, Submission

from .harness import Cluster, StoredMessage

QUEUE = "bench-memory"
#: The index of recent task ids is kept for 30 s and expires in two generations.
RECENT_EXPIRY_SECONDS = 65


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--horizon-keys", type=int, default=10_000)
    parser.add_argument("--coalesce-submissions", type=int, default=10_000)
    args = parser.parse_args(argv)

    cluster = Cluster(workers=0, concurrency=1)
    try:
        cluster.start()
        from django_keyed_queue.gate import Gate
        from django_keyed_queue.gate.keys import DEADLINE_INDEX, KeyNames
        from django_keyed_queue.process.state import get_gate

        gate = get_gate()
        client = gate.client
        stored = StoredMessage(gate, "template", 1, QUEUE)
        copy, message = stored.copy, stored.message

        def used() -> int:
            return int(client.info("memory")["used_memory"])

        def expire(prefix: str, count: int) -> None:
            """Touch every name of the keys, so Redis drops those whose time is up now, not when it samples them."""
            with client.pipeline(transaction=False) as pipe:
                for i in range(count):
                    names = KeyNames(f"{prefix}:{i}")
                    pipe.exists(*names.all(), names.joined, names.recent, names.recent_older, names.outcomes)
                pipe.execute()

        def to_idle(g: Gate, key: str, ticket: int) -> None:
            started = g.start(Start(key, ticket, 1))
            g.finish(Finish(key, ticket, started.token))

        print(f"Redis {client.info('server')['redis_version']}, {args.keys} keys, message of {len(message)} bytes")
        coalescing_key(gate, copy, used, args.coalesce_submissions)
        if not args.keys:
            return 0
        keys = [f"account:{i}" for i in range(args.keys)]
        base = used()
        for key in keys:
            task_id, copied = copy()
            gate.submit(Submission(key, copied, task_id=task_id))
        dispatched = used()
        for key in keys:
            task_id, copied = copy()
            gate.submit(Submission(key, copied, task_id=task_id))
        waiting = used()
        for key in keys:
            to_idle(gate, key, 1)  # grants ticket 2
            to_idle(gate, key, 2)
        idle = used()
        print(f"waiting {RECENT_EXPIRY_SECONDS} s for the index of recent task ids to expire ...", flush=True)
        time.sleep(RECENT_EXPIRY_SECONDS)
        expire("account", args.keys)
        idle_expired, names_left = used(), client.dbsize()
        # The reaper's visits (none runs here otherwise): a drained key's deadline-index entry, due by now, goes.
        visits = 0
        while visited := gate.reap(batch=5000)[0]:
            visits += visited
        reaped, names_reaped = used(), client.dbsize()

        horizon_gate = Gate(client, idle_horizon_seconds=2)
        before_horizon = used()
        for i in range(args.horizon_keys):
            task_id, copied = copy()
            horizon_gate.submit(Submission(f"short:{i}", copied, task_id=task_id))
            to_idle(horizon_gate, f"short:{i}", 1)
        print(f"waiting {RECENT_EXPIRY_SECONDS} s for their idle horizon (2 s) and recent ids ...", flush=True)
        time.sleep(RECENT_EXPIRY_SECONDS)
        expire("short", args.horizon_keys)
        while gate.reap(batch=5000)[0]:
            pass
        after_horizon, names_after = used(), client.dbsize()

        # A submission's record, kept with its ticket until a worker writes its row (here: write_due).
        from django_keyed_queue.records import submissions

        before_records = used()
        for i in range(args.horizon_keys):
            task_id, copied = copy()
            arguments = f"args=('recorded:{i}', 1) kwargs={{}}"
            record = submissions.encode_record(task_id, "testproject.demo.tasks.step", arguments)
            gate.submit(Submission(f"recorded:{i}", copied, task_id=task_id, record=record))
        with_records = used()
        written = submissions.write_due(gate)
        records_written = used()

        n, h = args.keys, args.horizon_keys
        print("Redis bytes (used_memory growth / count):")
        print(f"  a key with one dispatched task:          {(dispatched - base) / n:8.0f} per key")
        print(f"  a waiting task (the key's second):       {(waiting - dispatched) / n:8.0f} per task")
        print(f"  an idle key, both tasks done:            {(idle - base) / n:8.0f} per key")
        print(f"  an idle key, its recent ids expired:     {(idle_expired - base) / n:8.0f} per key")
        print(f"  then after the reaper's visit:           {(reaped - base) / n:8.0f} per key ({visits} keys visited)")
        print(f"  an idle key past its idle horizon:       {(after_horizon - before_horizon) / h:8.0f} per key")
        print(
            f"  a key with one dispatched task and its submission record: {(with_records - before_records) / h:8.0f}"
            f" per key; {(records_written - before_records) / h:8.0f} once its row was written ({written} rows)"
        )
        print(
            f"  Redis names: {names_left} for {n} idle keys, {names_reaped} once the reaper visited them; "
            f"{names_after - names_reaped} more for {h} keys past the horizon (before any record was kept)"
        )
        print(f"  the deadline index holds {client.zcard(DEADLINE_INDEX)} entries at the end: keys holding tasks")
    finally:
        cluster.stop()
    return 0


def coalescing_key(gate, copy, used, n: int) -> None:
    """One key, one running task, then ``n`` submissions of a coalescing task, and of one that does not."""
    from django_keyed_queue.gate.keys import KeyNames
    from django_keyed_queue.records import submissions

    task = json.loads(copy()[1])["task"]  # the stored message's own: the gate coalesces a task's tickets
    for key, coalesce in (("coalesced", task), ("queued", "")):
        before = used()
        running = gate.submit(Submission(key, copy()[1], task_id="running"))
        gate.start(Start(key, running.ticket, 1))
        for i in range(n):
            task_id, copied = copy()
            record = submissions.encode_record(task_id, task, f"args=('{key}', {i}) kwargs={{}}")
            gate.submit(Submission(key, copied, task_id=task_id, record=record, coalesce=coalesce))
        kept, messages = used(), gate.client.hlen(KeyNames(key).messages)
        while submissions.write_due(gate):
            pass
        written = used()
        print(
            f"  {n} submissions to a key {'that coalesces' if coalesce else 'that does not coalesce'}, one running: "
            f"{messages} stored messages, {(kept - before) / 1024:.0f} KiB with their records kept, "
            f"{(written - before) / 1024:.0f} KiB once their rows were written"
        )


if __name__ == "__main__":
    sys.exit(main())
