"""Test settings: the testproject pointed at a temp dir, a free port and a file database.

Set in the environment so the celery workers the tests start see the same.
``KEYED_QUEUE_TESTS_DATABASE=postgresql`` runs the tests on a PostgreSQL server
started here, before Django reads its settings, and stopped at the end of the run.
"""

import atexit
import os
import tempfile
from pathlib import Path

from testproject.servers import PostgresServer, free_port

_postgres = None


def stop_database_server() -> None:
    """Stop the PostgreSQL server of this run, if any, keeping its log in the run's data dir."""
    global _postgres
    if _postgres is not None:
        _postgres.stop()
        _postgres = None


#: Whose environment this is: the run's, or under pytest-xdist (``make check``) one worker's, each with its own
#: temp dir, Redis and database server. A process the tests start (a celery worker) inherits its runner's.
_OWNER = os.environ.get("PYTEST_XDIST_WORKER") or "1"

if os.environ.get("KEYED_QUEUE_TESTS_OWN_ENV") != _OWNER:
    _dir = tempfile.mkdtemp(prefix="keyed-queue-tests-")
    os.environ["KEYED_QUEUE_TESTS_OWN_ENV"] = _OWNER
    os.environ["TESTPROJECT_DATA_DIR"] = _dir
    os.environ["TESTPROJECT_DB"] = os.path.join(_dir, "db.sqlite3")
    os.environ["TESTPROJECT_REDIS_URL"] = f"redis://127.0.0.1:{free_port()}"
    os.environ["DJANGO_SETTINGS_MODULE"] = "testproject.settings"
    database = os.environ.get("KEYED_QUEUE_TESTS_DATABASE", "sqlite")
    if database == "postgresql":
        _postgres = PostgresServer(log_dir=Path(_dir) / "postgresql").start()
        atexit.register(stop_database_server)
        os.environ["TESTPROJECT_DATABASE_URL"] = _postgres.url("keyed_queue_tests")
    elif database != "sqlite":
        raise ValueError(f"KEYED_QUEUE_TESTS_DATABASE={database!r}: use sqlite or postgresql")

from testproject.settings import *  # noqa: E402,F403

#: A database of the records' own, used where a test sets KEYED_QUEUE_DATABASE (tests/django/test_database_router.py);
#: with the setting unset the router has no opinion and everything stays in "default".
DATABASES["queue"] = {  # noqa: F405
    "ENGINE": "django.db.backends.sqlite3",
    "NAME": os.path.join(os.environ["TESTPROJECT_DATA_DIR"], "queue.sqlite3"),
    "TEST": {"NAME": os.path.join(os.environ["TESTPROJECT_DATA_DIR"], "queue.sqlite3")},
}
DATABASE_ROUTERS = ["django_keyed_queue.records.router.KeyedQueueRouter"]
