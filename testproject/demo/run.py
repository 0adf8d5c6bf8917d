"""Run the demo: a local redis-server (unless one is configured), SQLite, a Celery
worker and the admin, with keyed tasks submitted so the admin has something to show.

    python -m testproject.demo.run            # serve the admin on http://127.0.0.1:8000/admin/
    python -m testproject.demo.run --check    # submit, wait for the tasks, fetch the admin, exit
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA_DIR = Path(os.environ.get("TESTPROJECT_DATA_DIR", ROOT / ".demo"))
ADMIN_USER, ADMIN_PASSWORD = "admin", "admin"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="run the tasks, fetch the admin once and exit")
    parser.add_argument("--port", type=int, default=8000, help="port of the admin (default 8000)")
    options = parser.parse_args()

    DATA_DIR.mkdir(parents=True, exist_ok=True)
    os.environ["TESTPROJECT_DATA_DIR"] = str(DATA_DIR)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    from testproject.servers import RedisServer, Worker

    redis_server = None
    if "TESTPROJECT_REDIS_URL" not in os.environ:
        os.environ["TESTPROJECT_REDIS_URL"] = f"redis://127.0.0.1:{free_port()}"
        redis_server = RedisServer(os.environ["TESTPROJECT_REDIS_URL"], DATA_DIR / "redis")
        redis_server.start()
        print(f"started redis-server at {os.environ['TESTPROJECT_REDIS_URL']}")

    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    users = get_user_model().objects
    if not users.filter(username=ADMIN_USER).exists():
        users.create_superuser(ADMIN_USER, "admin@example.com", ADMIN_PASSWORD)

    worker = Worker("demo", DATA_DIR / "logs", concurrency=2).start()
    print(f"started a celery worker (log: {worker.log_path})")
    try:
        submitted = submit_demo_tasks()
        if options.check:
            return check(submitted)
        print(f"admin: http://127.0.0.1:{options.port}/admin/ (user {ADMIN_USER}, password {ADMIN_PASSWORD})")
        call_command("runserver", f"127.0.0.1:{options.port}", use_reloader=False)
        return 0
    finally:
        worker.stop()
        if redis_server:
            redis_server.stop()


def submit_demo_tasks() -> list[str]:
    from testproject.demo.tasks import sync_account, write_file

    ids = []
    for round_ in range(3):
        for account_id in range(1, 6):
            ids.append(sync_account.delay(account_id, full=round_ == 0).id)
    for i in range(5):
        ids.append(write_file.delay("reports/daily.csv", f"line {i}\n").id)
    print(f"submitted {len(ids)} keyed tasks over 6 keys")
    return ids


def check(task_ids: list[str]) -> int:
    from django.test import Client

    from django_keyed_queue.models import KeyedTask

    deadline = time.monotonic() + 120
    while KeyedTask.objects.filter(task_id__in=task_ids, status="succeeded").count() < len(task_ids):
        if time.monotonic() > deadline:
            print("the demo tasks did not all succeed in time", file=sys.stderr)
            return 1
        time.sleep(0.5)
    client = Client()
    client.login(username=ADMIN_USER, password=ADMIN_PASSWORD)
    page = client.get("/admin/keyed_queue/keyedtask/", HTTP_HOST="127.0.0.1")
    if page.status_code != 200 or b"account:1" not in page.content:
        print(f"the admin list did not show the tasks (HTTP {page.status_code})", file=sys.stderr)
        return 1
    print(f"demo ok: {len(task_ids)} tasks succeeded and the admin lists them")
    return 0


if __name__ == "__main__":
    sys.exit(main())
