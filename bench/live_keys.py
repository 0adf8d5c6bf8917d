"""The live keys page at a million rows and thousands of live keys, on SQLite and on PostgreSQL.

    python -m bench.live_keys                                             # both databases, the defaults
    python -m bench.live_keys --rows 100000 --live 2000 --databases sqlite   # a quick look

Per database, in a process of its own (Django is configured once): a gate redis-server and a broker,
``--rows`` records loaded in bulk (bench/admin_fill.py: their newest 300 say unfinished and Redis holds
nothing of their keys, as a bench leaves them), ``--live`` keys submitted through ``apply_async_many``
with their first task started and two waiting (their rows written), and ``--drained`` keys in the
deadline index that hold nothing (finished since the reaper last looked). Then ``live_keys`` is timed:
the whole page's list, a search by a word many keys share, by a key's own id, and by a whole key.
Prints the median and p95 of each (wall clock), the Redis commands and queries of one call, what the
page found, and the plans of its record queries.
"""

from __future__ import annotations

import argparse
import sys
import time

from django_keyed_queue.gate import Start

from .harness import main_per_database
from .stats import median, percentile

QUEUE = "bench-live-keys"


def commands_run(client) -> int:
    return sum(v["calls"] for k, v in client.info("commandstats").items() if k.startswith("cmdstat_"))


def measure(gate, what: str, repeat: int, **kwargs) -> dict:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from django_keyed_queue.ops.console.live import live_keys

    before = commands_run(gate.client)
    with CaptureQueriesContext(connection) as queries:
        page = live_keys(**kwargs)
    commands = commands_run(gate.client) - before - 1  # the INFO that counted
    took = []
    for _ in range(repeat):
        began = time.perf_counter()
        live_keys(**kwargs)
        took.append((time.perf_counter() - began) * 1000)
    return {
        "what": what,
        "ms": [median(took), percentile(took, 95)],
        "commands": commands,
        "queries": len(queries),
        "shown": len(page.states),
        "first": page.states[0].key if page.states else None,
        "more": page.more,
        "unheld": len(page.unheld),
        "sql": [q["sql"] for q in queries.captured_queries],
    }


def live(args: argparse.Namespace, gate) -> None:
    """``--live`` keys "ledger:<n>": the first task of each started, two waiting; rows written."""
    from django_keyed_queue.testing import write_submission_rows
    from testproject.demo.tasks import step

    keys = [f"ledger:{n}" for n in range(args.live)]
    step.apply_async_many([(key, n) for key in keys for n in (1, 2, 3)], queue=QUEUE)
    for key in keys:
        assert gate.start(Start(key, 1, 1)).ok
    while write_submission_rows():
        pass
    index = gate.deadlines.names[0]
    for start in range(0, args.drained, 10_000):
        gate.client.zadd(index, {f"drained:{n}": 10**13 + n for n in range(start, min(args.drained, start + 10_000))})


def plans() -> list[str]:
    """The plans of the page's reads of the records at this size."""
    from django_keyed_queue.records.models import KeyedTask

    unheld = (
        KeyedTask.objects.filter(status="waiting", ticket__isnull=False)
        .exclude(key__in=[f"ledger:{n}" for n in range(100)])
        .order_by("id")
        .values_list("key", "enqueued_at")[:200]
    )
    waits = KeyedTask.objects.filter(key="ledger:7", ticket=2).values_list("status", "id")
    return [unheld.explain(), waits.explain()]


def child(args: argparse.Namespace) -> dict:
    from .admin_fill import fill
    from .harness import Cluster

    cluster = Cluster(workers=0, concurrency=1, database=args.database)
    try:
        cluster.start()
        from django.db import connection

        from django_keyed_queue.process.state import get_gate

        gate = get_gate()
        filled = fill(args.rows)
        began = time.perf_counter()
        live(args, gate)
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")  # as autovacuum would after the live keys' rows
        seeded = time.perf_counter() - began
        measure(gate, "warm-up", 1)
        pages = [
            measure(gate, "the whole list", args.repeat),
            measure(gate, 'search "ledger" (every live key)', args.repeat, search="ledger"),
            measure(gate, 'search "1001" (one id)', args.repeat, search="1001"),
            measure(gate, 'search "ledger:1001" (a key whole)', args.repeat, search="ledger:1001"),
        ]
        return {"database": connection.vendor, "fill": filled, "seed_seconds": seeded, "pages": pages, "plans": plans()}
    finally:
        cluster.stop()


def report(results: list[dict], args: argparse.Namespace) -> str:
    lines = [
        f"{args.rows:,} rows, {args.live:,} live keys (one running, two waiting), {args.drained:,} drained keys "
        "in the deadline index; ms median / p95 of live_keys()",
        "",
        "| database | call | ms | Redis commands | queries | shown | first | more | unheld |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for p in r["pages"]:
            lines.append(
                f"| {r['database']} | {p['what']} | {p['ms'][0]:.1f} / {p['ms'][1]:.1f} | {p['commands']:,} | "
                f"{p['queries']} | {p['shown']} | {p['first']} | {p['more']:,} | {p['unheld']} |"
            )
    for r in results:
        lines += ["", f"--- {r['database']}: loaded in {r['fill']['load_seconds']:.0f} s, live keys seeded in "
                  f"{r['seed_seconds']:.0f} s; plans of the unheld rows' read and of a wait's row:"]  # fmt: skip
        lines += ["", *r["plans"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--live", type=int, default=10_000, help="keys with a running task and two waiting")
    parser.add_argument("--drained", type=int, default=50_000, help="keys in the deadline index holding nothing")
    parser.add_argument("--repeat", type=int, default=20)
    return main_per_database("bench.live_keys", parser, argv, child, report)


if __name__ == "__main__":
    sys.exit(main())
