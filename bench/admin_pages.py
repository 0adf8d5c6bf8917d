"""The admin's keyed task list at a million rows, on SQLite and on PostgreSQL.

    python -m bench.admin_pages                                   # 1,000,000 rows, both databases
    python -m bench.admin_pages --rows 100000 --databases sqlite  # a quick look

For each database: a fresh migrated database (PostgreSQL: a server of its own in a
temp dir), filled in bulk (bench/admin_fill.py), then each page of the list is
fetched through Django's test client as a logged-in superuser. Prints the median
and p95 of the whole request (wall clock), its median CPU time in this process
(what other load on the machine barely moves), the median and p95 of the page's
SELECT alone (with a search, its lookups too), and the query plans (SQLite
``EXPLAIN QUERY PLAN``, PostgreSQL ``EXPLAIN (ANALYZE, BUFFERS)``).
The keys' later words, which the search reads, are written after the bulk load, timed, as
the records' writer writes them with a key's first row.
Each database runs in a child process of its own, since Django is configured once.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

from .stats import median, percentile

ROOT = Path(__file__).resolve().parent.parent  # the child process runs from here, as python -m bench.admin_pages
URL = "/admin/keyed_queue/keyedtask/"
TARGET_MS = 100
SEARCH_TARGET_MS = 200  # a search's p95: it looks its term up before it reads the page
RARE_KEYS = 20  # rows given keys refund:0..refund:19, spread over the table: a key family that is rare
#: Rows given keys region:N:eu, spread over the table: a word ("eu") of more keys than the search reads.
WORD_OF_MANY_KEYS = 2000
#: Rows given keys of 100 one-letter words, each parted by other separators: for every separator of a
#: term of one-letter words, many readings that some key has, the costliest term the search can be sent.
MANY_WORD_KEYS = 32
SEPARATORS = " :/-_.|#,;=+@"
#: 199 characters: 100 one-letter words with a space between each (an unbounded search read 99 separators).
WORST_TERM = " ".join("x" * 100)


# -- the child: one database, filled and measured --


def scenarios(client, rows: int) -> list[tuple[str, str]]:
    """(what, query string) of each page timed; the deep page is reached by following 50 "Older" links."""
    from django_keyed_queue.records.models import KeyedTask

    from .admin_fill import TASKS

    query = ""
    for _ in range(min(50, rows // 100 - 2)):  # fewer on a small table
        body = html.unescape(client.get(URL + query).content.decode())
        query = re.search(r'<a href="([^"]*)" id="cursor-older"', body).group(1)
    middle = rows // 2
    rare_name = TASKS[-1][0]
    task_id = KeyedTask.objects.values_list("task_id", flat=True).get(pk=middle)
    cold = KeyedTask.objects.filter(pk__gte=middle, key__startswith="account:").values_list("key", flat=True)[0]
    short_name = rare_name.rsplit(".", 1)[-1]
    number = cold.rpartition(":")[2]
    return [
        ("first page", ""),
        ("after 50 Older links", query),
        ("cursor in the middle", f"?cursor={middle}"),
        ("status failed (2%)", "?status__exact=failed"),
        ("status failed, mid cursor", f"?status__exact=failed&cursor={middle}"),
        ("task name (3%)", f"?task_name={rare_name}"),
        ("search a task id", f"?q={task_id}"),
        ("search a short id (8 characters)", f"?q={task_id[:8]}"),
        ("search a hot key (1%)", "?q=tenant:3"),
        ("search a cold key", f"?q={cold}"),
        ("search a cold key with a space", "?q=" + quote(cold.replace(":", " "))),
        ("search a key prefix of most rows (account, 90%)", "?q=account"),
        ("search account, mid cursor", f"?q=account&cursor={middle}"),
        (f"search a rare key prefix (refund, {RARE_KEYS} rows)", "?q=refund"),
        (f"search a short task name ({short_name}, 3%)", f"?q={short_name}"),
        ("search a term that matches nothing", "?q=" + quote("no such:thing")),
        (f"search a number of a cold key ({number} of {cold})", f"?q={number}"),
        ("search a number of a hot key (3: tenant:3, account:3)", "?q=3"),
        ("search 1001: account:1001, then task ids that begin so", "?q=1001"),
        ("search a number of no key (88888: task ids that begin so)", "?q=88888"),
        (f"search a word of {WORD_OF_MANY_KEYS:,} keys (eu, walked)", "?q=eu"),
        ("search from the box, one task: its page opens (302)", f"?q={task_id}&_searched=1"),
        (
            f"search the worst term (199 characters of 'x x x ...', {MANY_WORD_KEYS} keys of 100 words)",
            "?q=" + quote(WORST_TERM),
        ),  # fmt: skip
        ("search the worst term with its separators mixed", "?q=" + quote(many_word_key(5))),
        ("hot key + failed + mid cursor", f"?q=tenant:3&status__exact=failed&cursor={middle}"),
        ("failed + name + mid cursor", f"?status__exact=failed&task_name={TASKS[0][0]}&cursor={middle}"),
    ]


def rare_keys(rows: int) -> None:
    """Re-key ``RARE_KEYS`` rows spread evenly over the table to refund:N (after the fill's ANALYZE:
    20 rows move no statistic)."""
    from django_keyed_queue.records.models import KeyedTask

    step = max(rows // RARE_KEYS, 1)
    for n, pk in enumerate(range(7, rows + 1, step)):
        KeyedTask.objects.filter(pk=pk).update(key=f"refund:{n}")


def word_of_many_keys(rows: int) -> None:
    """Re-key ``WORD_OF_MANY_KEYS`` rows spread evenly over the table to region:N:eu."""
    from django_keyed_queue.records.models import KeyedTask

    step = max(rows // WORD_OF_MANY_KEYS, 1)
    for n, pk in enumerate(range(11, rows + 1, step)):
        KeyedTask.objects.filter(pk=pk).update(key=f"region:{n}:eu")


def many_word_key(n: int) -> str:
    """A key of 100 one-letter words, parted by the separators in turn from the ``n``-th."""
    return "".join(f"x{sep}" for sep in (SEPARATORS * 20)[n : n + 99]) + "x"


def many_word_keys(rows: int) -> None:
    """Re-key ``MANY_WORD_KEYS`` rows spread evenly over the table to keys of many words."""
    from django_keyed_queue.records.models import KeyedTask

    step = max(rows // MANY_WORD_KEYS, 1)
    for n, pk in enumerate(range(13, rows + 1, step)):
        KeyedTask.objects.filter(pk=pk).update(key=many_word_key(n % len(SEPARATORS) + n // len(SEPARATORS)))


def write_key_words() -> dict:
    """The keys' later words for rows made by ``bulk_create`` (the records' writer writes them with a key's
    first row): ``key_words.remember`` over the keys there, in key order, ``CHUNK`` keys a transaction."""
    from django.db import connection, transaction

    from django_keyed_queue.records import key_words
    from django_keyed_queue.records.models import KeyedTask, KeyWord

    chunk_size, last = 10_000, None
    keys = KeyedTask.objects.order_by("key").values_list("key", flat=True).distinct()
    began = time.perf_counter()
    while chunk := list((keys if last is None else keys.filter(key__gt=last))[:chunk_size]):
        last = chunk[-1]
        key_words.KNOWN.clear()
        with transaction.atomic():
            key_words.remember(connection.alias, chunk)
    took = time.perf_counter() - began
    with connection.cursor() as cursor:
        cursor.execute(f"VACUUM ANALYZE {KeyWord._meta.db_table}" if connection.vendor == "postgresql" else "ANALYZE")
    return {"rows": KeyWord.objects.count(), "seconds": took}


def explain(sql: str) -> str:
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql)
            return "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute("EXPLAIN QUERY PLAN " + sql)
        rows = cursor.fetchall()
    depth = {0: -1}
    lines = []
    for node, parent, _, detail in rows:
        depth[node] = depth.get(parent, -1) + 1
        lines.append("  " * depth[node] + detail)
    return "\n".join(lines)


def measure(client, what: str, query: str, repeat: int) -> dict:
    from django.contrib import admin
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from django_keyed_queue.ops.console.changelist import FEW_MATCHES
    from django_keyed_queue.records.models import KeyedTask

    with CaptureQueriesContext(connection) as captured:
        response = client.get(URL + query)
    assert response.status_code == (302 if "_searched=" in query else 200), (what, response.status_code)
    sql = [q["sql"] for q in captured.captured_queries]
    limit = f"LIMIT {admin.site._registry[KeyedTask].list_per_page + 1}"
    pages = [s for s in sql if "keyed_queue_keyedtask" in s and limit in s]
    # A search's lookups: which of its readings some row matches, the task names, a word's keys, the ids
    # of few matches.
    searching = ("SELECT EXISTS(", "WITH RECURSIVE names")
    lookups = [
        s
        for s in sql
        if s.startswith(searching) or f"LIMIT {FEW_MATCHES + 1}" in s or s.startswith('SELECT "keyed_queue_keyword"')
    ]
    # No page SELECT only when the search found that nothing matches; two when it lists the rows of its keys
    # first and the others after, on one page.
    assert len(pages) in (1, 2) or (not pages and lookups), (what, sql)
    assert not [s for s in sql if "COUNT(" in s.upper()], (what, sql)
    shown = len(re.findall(r'<tr><td class="action-checkbox">', response.content.decode()))
    request_ms, cpu_ms, sql_ms = [], [], []
    for _ in range(repeat):
        began, cpu = time.perf_counter(), time.process_time()
        client.get(URL + query)
        request_ms.append((time.perf_counter() - began) * 1000)
        cpu_ms.append((time.process_time() - cpu) * 1000)  # this process only: load elsewhere barely moves it
    with connection.cursor() as cursor:
        for _ in range(repeat):
            began = time.perf_counter()
            for statement in lookups + pages:
                cursor.execute(statement)
                cursor.fetchall()
            sql_ms.append((time.perf_counter() - began) * 1000)
    return {
        "what": what,
        "query": query,
        "rows_shown": shown,
        "queries": len(sql),
        "request_ms": [median(request_ms), percentile(request_ms, 95)],
        "request_cpu_ms": median(cpu_ms),
        "sql_ms": [median(sql_ms), percentile(sql_ms, 95)],
        "sql": "\n\n".join(pages) or "(no page SELECT: the search found that nothing matches)",
        "plan": "\n\n".join(explain(page) for page in pages),
        "lookups": [{"sql": statement, "plan": explain(statement)} for statement in lookups],
    }


def target_ms(query: str) -> int:
    """A page's p95 target: a search's is higher, as it looks its term up before it reads the page."""
    return SEARCH_TARGET_MS if "q=" in query else TARGET_MS


def avoided(rows: int, cold_key: str) -> list[dict]:
    """What Django's own change list would run on the same table, timed alone (5 runs, median)."""
    from django.db.models import Q

    from django_keyed_queue.records.models import KeyedTask

    tasks = KeyedTask.objects.order_by("-id")
    queries = [
        ("COUNT(*) of every row", lambda: tasks.count()),
        ("COUNT(*) of failed rows", lambda: tasks.filter(status="failed").count()),
        ("page by OFFSET, middle of the table", lambda: list(tasks[rows // 2 : rows // 2 + 100])),
        (
            "search of =key, =task_id (iexact) for a cold key",
            lambda: list(tasks.filter(Q(key__iexact=cold_key) | Q(task_id__iexact=cold_key))[:101]),
        ),
    ]
    measured = []
    for what, run in queries:
        times = []
        for _ in range(5):
            began = time.perf_counter()
            run()
            times.append((time.perf_counter() - began) * 1000)
        measured.append({"what": what, "ms": median(times)})
    return measured


def child(rows: int, repeat: int) -> dict:
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client

    from .admin_fill import fill

    call_command("migrate", verbosity=0)
    filled = fill(rows)
    rare_keys(rows)
    word_of_many_keys(rows)
    many_word_keys(rows)
    words = write_key_words()
    user = get_user_model().objects.create_superuser("bench", "bench@example.com", "bench")
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(user)
    client.get(URL)  # warm the caches and the templates
    load = _load()
    chosen = scenarios(client, rows)
    pages = [measure(client, what, query, repeat) for what, query in chosen]
    cold_key = dict(chosen)["search a cold key"].removeprefix("?q=")
    return {
        "metrics_ms": metrics_gauges_ms(repeat),
        "avoided": avoided(rows, cold_key),
        "database": connection.vendor,
        "version": _version(connection),
        "fill": filled,
        "key_words": words,
        "pages": pages,
        "load": load,
        "load_after": _load(),
    }


def metrics_gauges_ms(repeat: int) -> list[float]:
    """Median and p95 of what a metrics scrape reads from the records (its gauges; no Redis here)."""
    from django_keyed_queue.ops.console.metrics import _record_gauges

    took = []
    for _ in range(repeat):
        began = time.perf_counter()
        list(_record_gauges({}))
        took.append((time.perf_counter() - began) * 1000)
    return [median(took), percentile(took, 95)]


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def _version(connection) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT version()" if connection.vendor == "postgresql" else "SELECT sqlite_version()")
        return cursor.fetchone()[0].split(" on ")[0]


# -- the parent: a database at a time, then the report --


def run_database(database: str, args: argparse.Namespace, directory: Path) -> dict:
    from testproject.servers import PostgresServer

    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "testproject.settings",
        "TESTPROJECT_DATA_DIR": str(directory),
        "TESTPROJECT_DB": str(directory / "bench.sqlite3"),
        "TESTPROJECT_DEBUG": "0",  # no query log, as in production
        "KEYED_QUEUE_LOG": "WARNING",
    }
    env.pop("TESTPROJECT_DATABASE_URL", None)
    directory.mkdir(parents=True)
    server = None
    try:
        if database == "postgresql":
            server = PostgresServer(log_dir=directory / "postgresql").start()
            server.create_database("keyed_queue_bench")
            env["TESTPROJECT_DATABASE_URL"] = server.url("keyed_queue_bench")
        options = ["--rows", str(args.rows), "--repeat", str(args.repeat)]
        command = [sys.executable, "-m", "bench.admin_pages", "--child", *options]
        done = subprocess.run(command, env=env, cwd=ROOT, stdout=subprocess.PIPE, check=True, text=True)
        return json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        if server is not None:
            server.stop()


def report(results: list[dict], rows: int) -> str:
    lines = [f"{rows:,} keyed task rows; milliseconds, median / p95 of each page", ""]
    for result in results:
        fill = result["fill"]
        lines.append(
            f"{result['version']}: loaded in {fill['load_seconds']:.0f} s, analyzed in {fill['analyze_seconds']:.0f} s;"
            f" the keys' words ({result['key_words']['rows']:,} rows) written in {result['key_words']['seconds']:.1f} s"
        )
    lines.append(f"load average of the machine: {results[0]['load']} before, {results[-1]['load_after']} after")
    names = [r["database"] for r in results]
    header = "| page | rows | " + " | ".join(f"{n} request | {n} CPU | {n} SQL" for n in names) + " |"
    lines += ["", header, "|" + "---|" * (2 + 3 * len(results))]
    for i, page in enumerate(results[0]["pages"]):
        cells = [page["what"], str(page["rows_shown"])]
        for result in results:
            mine = result["pages"][i]
            cells += [
                "{:.1f} / {:.1f}".format(*mine["request_ms"]),
                f"{mine['request_cpu_ms']:.1f}",
                "{:.2f} / {:.2f}".format(*mine["sql_ms"]),
            ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "A metrics scrape's gauges from the records (tasks waiting and running per task, keys active,"]
    lines += [
        "the oldest wait): "
        + ", ".join("{}: {:.1f} / {:.1f} ms".format(r["database"], *r["metrics_ms"]) for r in results)
    ]
    lines += ["", "What the cursor list does not run (Django's change list would), the SQL alone:", ""]
    lines += ["| query | " + " | ".join(f"{n} ms" for n in names) + " |", "|" + "---|" * (1 + len(results))]
    for i, query in enumerate(results[0]["avoided"]):
        lines.append(f"| {query['what']} | " + " | ".join(f"{r['avoided'][i]['ms']:.1f}" for r in results) + " |")
    for searches, kind in ((False, "a page"), (True, "a search")):
        chosen = [p for r in results for p in r["pages"] if ("q=" in p["query"]) == searches]
        slowest = max(p["request_ms"][1] for p in chosen)
        target = target_ms("?q=" if searches else "")
        verdict = "within" if slowest < target else "OVER"
        lines += ["", f"slowest p95 of a whole request, {kind}: {slowest:.1f} ms ({verdict} the {target} ms target)"]
    for result in results:
        for page in result["pages"]:
            lines += ["", f"--- {result['database']}: {page['what']} ({page['query'] or 'no parameters'})"]
            for lookup in page["lookups"]:
                lines += ["search lookup: " + lookup["sql"], "", lookup["plan"], ""]
            lines += [page["sql"], "", page["plan"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=30, help="requests timed per page (default 30)")
    parser.add_argument("--databases", default="sqlite,postgresql", help="comma-separated: sqlite, postgresql")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.rows, args.repeat)))
        return 0
    results = []
    with tempfile.TemporaryDirectory(prefix="keyed-queue-bench-admin-") as tmp:
        for database in args.databases.split(","):
            began = time.perf_counter()
            results.append(run_database(database.strip(), args, Path(tmp) / database))
            print(f"{database}: done in {time.perf_counter() - began:.0f} s", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    print(report(results, args.rows))
    over = [p for r in results for p in r["pages"] if p["request_ms"][1] >= target_ms(p["query"])]
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
