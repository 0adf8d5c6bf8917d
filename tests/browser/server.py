"""What the browser tier's admin server (``runserver``, started by the conftest) runs with."""

import os
from pathlib import Path

from tests.gate_redis import WORKERLESS_GATE_DB

#: The run's data dir: the server's log and the screenshots go there, and on into ``test-artifacts/``.
DATA_DIR = Path(os.environ["TESTPROJECT_DATA_DIR"])
#: The gate of the tests and of the server: a database the session's workers (if an earlier tier
#: started them) do not reap, so a holder a test leaves overdue stays as the test left it.
GATE_URL = f"{os.environ['TESTPROJECT_REDIS_URL']}/{WORKERLESS_GATE_DB}"
#: The server's reaper period: a holder is stuck 2 periods past its deadline, 0.5 s here instead of 10 s.
SERVER_REAP_INTERVAL_SECONDS = 0.25
