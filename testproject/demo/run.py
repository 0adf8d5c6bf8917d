"""Run the demo: a local redis-server (unless one is configured), SQLite, a Celery worker and the admin, with
keyed tasks submitted so the admin has something to show.

    python -m testproject.demo.run            # serve the admin on http://127.0.0.1:8000/admin/
    python -m testproject.demo.run --check    # submit, wait for the tasks, check the admin, exit

SIGTERM, SIGINT (Ctrl-C) and SIGHUP stop it and everything it started.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
from contextlib import ExitStack
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DATA_DIR = ROOT / ".demo"
DATA_DIR = Path(os.environ.get("TESTPROJECT_DATA_DIR", DEFAULT_DATA_DIR))
ADMIN_USER, ADMIN_PASSWORD = "admin", "admin"
#: What the tests wait for: every scene is in place and the admin answers.
READY = "the demo is running: Ctrl-C stops it and everything it started"


def main() -> int:
    from testproject.servers import ServerError

    from .processes import DemoError, Stopped, stop_on_signals

    stop_on_signals()  # first: a signal at any later point stops what was started until then
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="run the tasks, check the admin once and exit")
    parser.add_argument("--port", type=int, default=8000, help="port of the admin (default 8000)")
    options = parser.parse_args()
    try:
        with ExitStack() as stack:
            return run(options, stack)
    except (DemoError, ServerError) as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 1
    except Stopped as stop:
        print(f"demo: stopped ({stop}), and everything it started", file=sys.stderr)
        # Ctrl-C is how a person ends the demo: a clean end (make says no error); another signal says itself.
        return 0 if stop.signum == signal.SIGINT else 128 + stop.signum


def run(options: argparse.Namespace, stack: ExitStack) -> int:
    from testproject.servers import RedisServer, Worker, free_port

    from . import processes

    DATA_DIR.mkdir(parents=True, exist_ok=True)
    stack.enter_context(processes.lock_data_dir(DATA_DIR))
    os.environ["TESTPROJECT_DATA_DIR"] = str(DATA_DIR)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    web = None if options.check else stack.enter_context(processes.bind_web_server(options.port))

    own_redis = "TESTPROJECT_REDIS_URL" not in os.environ
    if own_redis:
        # The demo's Redis keeps its data under .demo/redis (append-only file), beside the database
        # under .demo/: a re-run finds the gate as the last run left it (ticket numbers go on from
        # the rows already there, a paused key is still paused, a queue still waits, an idempotency
        # key still points at a task the gate knows). Starting both fresh would throw away the
        # history an operator came to explore. One without the other is set aside (see below).
        # As in production, a key left idle past KEYED_QUEUE_IDLE_HORIZON_SECONDS (a day) is gone
        # from Redis and its tickets start again at 1 (docs/guarantees.md).
        os.environ["TESTPROJECT_REDIS_URL"] = f"redis://127.0.0.1:{free_port()}"
        for line in keep_records_and_gate_together(sqlite_path(), DATA_DIR / "redis"):
            print(line)
        server = RedisServer(os.environ["TESTPROJECT_REDIS_URL"], DATA_DIR / "redis")
        stack.callback(server.launch("--appendonly", "yes").stop)
        server.wait_ready()
        print(f"started redis-server at {os.environ['TESTPROJECT_REDIS_URL']} (data in {shown(DATA_DIR / 'redis')})")

    from django.conf import settings

    # For manage.py in another shell: the operator commands reach this demo's Redis with nothing exported.
    url_file = Path(settings.TESTPROJECT_REDIS_URL_FILE)
    url_file.write_text(os.environ["TESTPROJECT_REDIS_URL"] + "\n")
    stack.callback(url_file.unlink, missing_ok=True)

    # Started before the database is migrated, so that the two overlap: a worker touches the
    # database only for tasks and for what its reaper finds, and there is none before the demo submits.
    worker = Worker("demo", DATA_DIR / "logs", concurrency=3)
    worker_log = worker.log_path
    if worker_log.exists():  # keep the last run's log aside, as <name>.1
        worker_log.replace(worker_log.with_name(worker_log.name + ".1"))
    # A cold shutdown: a warm one would wait for the slow report (a minute). A task cut this way is
    # recovered as after any lost worker (its lease runs out; the next run's reaper dispatches it).
    stack.callback(worker.launch().stop, 5.0, cold=True)

    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    users = get_user_model().objects
    if not users.filter(username=ADMIN_USER).exists():
        users.create_superuser(ADMIN_USER, "admin@example.com", ADMIN_PASSWORD)
    worker.wait_ready()
    print(f"started a celery worker (log: {shown(worker_log)})")

    from . import scenario

    done = scenario.submit()
    print(f"submitted {len(done.quick)} quick tasks over 6 keys, and the scenes below")
    missing = scenario.wait_until_settled(done, timeout=120 if options.check else 20, all_quick=options.check)
    if missing:
        print("not in place in time: " + "; ".join(missing), file=sys.stderr)
        if options.check:
            return 1
    print("\nleft to look at:")
    for line in scenario.describe(done):
        print(f"  {line}")
    if options.check:
        return check(done)

    base = f"http://127.0.0.1:{options.port}"
    print(f"\nthe admin (user {ADMIN_USER}, password {ADMIN_PASSWORD}):")
    for label, path in scenario.admin_paths(done):
        print(f"  {label + ':':<18}{base}{path}")
    print("\noperator commands, in another terminal:")
    for line in operator_commands():
        print(f"  {line}")
    print(f"\n{READY}", flush=True)
    processes.serve(web)
    return 0


def sqlite_path() -> Path | None:
    """The demo's SQLite file; None for a database it does not own (PostgreSQL, or a file named elsewhere)."""
    from django.conf import settings

    database = settings.DATABASES["default"]
    path = Path(database["NAME"])
    return path if database["ENGINE"] == "django.db.backends.sqlite3" and path.is_relative_to(DATA_DIR) else None


def keep_records_and_gate_together(db_path: Path | None, redis_dir: Path) -> list[str]:
    """The records and the gate start together: a database without its Redis data (a demo from before
    the data was kept, or a removed .demo/redis) is moved aside, and Redis data without its database
    is removed, so that both start fresh. Says what it did."""
    from .processes import has_redis_data, remove_redis_data

    if db_path is None:
        return []
    if db_path.exists() and not has_redis_data(redis_dir):
        aside = db_path.with_name(f"{db_path.stem}-{datetime.now():%Y%m%d-%H%M%S}{db_path.suffix}")
        for suffix in ("", "-wal", "-shm"):
            if Path(f"{db_path}{suffix}").exists():
                Path(f"{db_path}{suffix}").replace(f"{aside}{suffix}")
        return [f"{shown(db_path)} had no Redis data beside it: moved to {shown(aside)}, both start fresh"]
    if has_redis_data(redis_dir) and not db_path.exists():
        remove_redis_data(redis_dir)
        return [f"{shown(redis_dir)} had no database beside it: removed its data, both start fresh"]
    return []


def operator_commands() -> list[str]:
    """The commands to try, exactly as they can be pasted into another terminal."""
    python = shown(Path(sys.executable))
    prefix = "" if DATA_DIR == DEFAULT_DATA_DIR else f"TESTPROJECT_DATA_DIR={shlex.quote(str(DATA_DIR))} "
    from .scenario import PAUSED_KEY

    manage = f"{prefix}{shlex.quote(python)} testproject/manage.py"
    return [
        f"cd {shlex.quote(str(ROOT))}",
        f"{manage} keyed_queue_status",
        f"{manage} keyed_queue_status --key {PAUSED_KEY}",
        f"{manage} keyed_queue_resume {PAUSED_KEY}",
        f"{manage} keyed_queue_pause {PAUSED_KEY}",
        f"{manage} keyed_queue_reap --dry-run",
    ]


def shown(path: Path) -> str:
    """A path as printed: relative to the repository when it is inside it."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def check(done) -> int:
    """Each admin page the demo prints answers and shows its scene."""
    from django.test import Client
    from django.utils.html import escape

    from django_keyed_queue.records.models import KeyedTask

    from .scenario import PAUSED_KEY, SLOW_KEY, admin_paths

    client = Client()
    client.login(username=ADMIN_USER, password=ADMIN_PASSWORD)
    expected = {"tasks": [b"account:1"], "live keys": [SLOW_KEY.encode(), PAUSED_KEY.encode()]}
    error = KeyedTask.objects.get(task_id=done.failed).error.splitlines()[0]  # then its traceback
    expected["failed task"] = [b"ValueError: ", escape(error).encode(), b"Traceback (most recent call last)"]
    for label, path in admin_paths(done):
        page = client.get(path, HTTP_HOST="127.0.0.1")
        if page.status_code != 200 or not all(text in page.content for text in expected.get(label, [])):
            print(f"the admin's {label} page did not show its scene (HTTP {page.status_code})", file=sys.stderr)
            return 1
    print(f"demo ok: {len(done.quick)} tasks succeeded and the admin lists them, every scene in place")
    print(f"charge: {done.charges[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
