"""The task list's Retry of many selected failed tasks, on SQLite and on PostgreSQL.

    python -m bench.bulk_actions                          # 40 and 200 tasks, both databases
    python -m bench.bulk_actions --tasks 40 --databases sqlite

Per database, in a process of its own (Django is configured once): a gate redis-server and a broker
(``bench.harness.Cluster``, no worker: the retries' messages wait on the broker), ``--tasks`` failed
tasks over as many keys, selected on the task list as an operator selects them. Timed through Django's
test client as a logged-in superuser, each round on new failed tasks: the first POST (the page that says
what Retry does to each task) and the confirming POST (every task retried: a submission each, its row
marked, the admin's log written), then the messages the operator is told (one). Prints the median and
p95 of each, in milliseconds, and the queries and Redis commands of one round.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time

from .harness import main_per_database
from .stats import median, percentile

QUEUE = "bench-bulk-actions"
URL = "/admin/keyed_queue/keyedtask/"
TARGET_MS = 1000  # a Retry of 40 tasks answers within a second


def commands_run(client) -> int:
    return sum(v["calls"] for k, v in client.info("commandstats").items() if k.startswith("cmdstat_"))


def failed_tasks(count: int, round_: int) -> list[int]:
    """``count`` failed tasks over as many keys, as their workers left them; their row ids."""
    from django_keyed_queue.records.models import KeyedTask
    from django_keyed_queue.testing import write_submission_rows
    from testproject.demo.tasks import step

    results = step.apply_async_many([(f"bulk{round_}:{n}", n) for n in range(count)], queue=QUEUE)
    while write_submission_rows():
        pass
    ids = [r.id for r in results]
    KeyedTask.objects.filter(task_id__in=ids).update(status="failed", error="boom", attempts=1)
    return list(KeyedTask.objects.filter(task_id__in=ids).values_list("pk", flat=True))


def one_round(client, gate, count: int, round_: int) -> dict:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    pks = failed_tasks(count, round_)
    selected = {"action": "retry_tasks", "_selected_action": pks}
    began = time.perf_counter()
    shown = client.post(URL, selected)
    shown_ms = (time.perf_counter() - began) * 1000
    form = re.search(r'<form method="post">(.*?)</form>', shown.content.decode(), re.S)
    assert form is not None, "the confirmation offers a form"
    posted: dict[str, list[str]] = {}
    for name, value in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', form.group(1)):
        posted.setdefault(name, []).append(value)
    before = commands_run(gate.client)
    with CaptureQueriesContext(connection) as queries:
        began = time.perf_counter()
        done = client.post(URL, posted, follow=True)
        done_ms = (time.perf_counter() - began) * 1000
    page = done.content.decode()
    told = re.findall(r'<li class="(?:success|warning|error|info)">', page)  # the messages; their lists have none
    assert len(told) == 1 and f"Retry done to {count} of {count} tasks." in page, page[:2000]
    return {
        "shown_ms": shown_ms,
        "done_ms": done_ms,
        "queries": len(queries),
        "commands": commands_run(gate.client) - before - 1,
        "messages": len(told),
    }


def child(args: argparse.Namespace) -> dict:
    from .harness import Cluster

    cluster = Cluster(workers=0, concurrency=1, database=args.database)
    try:
        cluster.start()
        from django.contrib.auth import get_user_model
        from django.db import connection
        from django.test import Client

        from django_keyed_queue.process.state import get_gate

        gate = get_gate()
        client = Client(HTTP_HOST="127.0.0.1")
        client.force_login(get_user_model().objects.create_superuser("bench", "bench@example.com", "bench"))
        client.get(URL)  # warm the templates
        results = []
        for count in args.tasks:
            one_round(client, gate, count, 10_000 + count)  # warm-up
            rounds = [one_round(client, gate, count, r * 1000 + count) for r in range(args.rounds)]
            results.append(
                {
                    "tasks": count,
                    "shown_ms": [
                        median([r["shown_ms"] for r in rounds]),
                        percentile([r["shown_ms"] for r in rounds], 95),
                    ],
                    "done_ms": [median([r["done_ms"] for r in rounds]), percentile([r["done_ms"] for r in rounds], 95)],
                    "queries": rounds[-1]["queries"],
                    "commands": rounds[-1]["commands"],
                    "messages": rounds[-1]["messages"],
                }
            )
        return {"database": connection.vendor, "results": results}
    finally:
        cluster.stop()


def report(results: list[dict], args: argparse.Namespace) -> str:
    lines = [
        f"The task list's Retry of many failed tasks; ms median / p95 over {args.rounds} rounds (the machine's "
        f"load average {os.getloadavg()[0]:.1f})",
        "",
        "| database | tasks | what it will do (page) | retried (POST) | queries | Redis commands | messages |",
        "|---|---|---|---|---|---|---|",
    ]
    slowest = 0.0
    for r in results:
        for row in r["results"]:
            lines.append(
                f"| {r['database']} | {row['tasks']} | {row['shown_ms'][0]:.0f} / {row['shown_ms'][1]:.0f} | "
                f"{row['done_ms'][0]:.0f} / {row['done_ms'][1]:.0f} | {row['queries']} | {row['commands']} | "
                f"{row['messages']} |"
            )
            if row["tasks"] == 40:
                slowest = max(slowest, row["done_ms"][1])
    verdict = "met" if slowest <= TARGET_MS else "OVER"
    lines += ["", f"slowest p95 of a Retry of 40 tasks: {slowest:.0f} ms ({verdict} the {TARGET_MS} ms target)"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=lambda s: [int(n) for n in s.split(",")], default=[40, 200])
    parser.add_argument("--rounds", type=int, default=5)
    return main_per_database("bench.bulk_actions", parser, argv, child, report)


if __name__ == "__main__":
    sys.exit(main())
