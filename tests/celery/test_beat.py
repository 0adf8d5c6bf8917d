"""celery beat schedules the reaper without any configuration from the project."""

import os
import signal
import subprocess
import sys

from testproject.servers import ROOT
from tests.waiting import wait_until


def test_beat_sends_the_reaper_on_its_own(redis_server, tmp_path):
    log = tmp_path / "beat.log"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "testproject.settings", "KEYED_QUEUE_REAP_INTERVAL_SECONDS": "0.5"}
    with open(log, "wb") as out:
        beat = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "testproject", "beat", "-l", "INFO",
             "-s", str(tmp_path / "schedule")],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        sent = "Sending due task keyed-queue-reap (keyed_queue.reap)"
        wait_until(lambda: log.read_text(errors="replace").count(sent) >= 2, timeout=30, message="beat to send it")
    finally:
        beat.send_signal(signal.SIGTERM)
        beat.wait(20)
