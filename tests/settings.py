"""Test settings: the testproject pointed at a temp dir, a free port and a file database.

Set in the environment so the celery workers the tests start see the same.
"""

import os
import socket
import tempfile


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if os.environ.get("KEYED_QUEUE_TESTS_OWN_ENV") != "1":
    _dir = tempfile.mkdtemp(prefix="keyed-queue-tests-")
    os.environ["KEYED_QUEUE_TESTS_OWN_ENV"] = "1"
    os.environ["TESTPROJECT_DATA_DIR"] = _dir
    os.environ["TESTPROJECT_DB"] = os.path.join(_dir, "db.sqlite3")
    os.environ["TESTPROJECT_REDIS_URL"] = f"redis://127.0.0.1:{_free_port()}"
    os.environ["DJANGO_SETTINGS_MODULE"] = "testproject.settings"

from testproject.settings import *  # noqa: E402,F403
