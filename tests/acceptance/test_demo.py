"""The README's demo command works: its own redis-server, SQLite, a worker and the admin."""

import os
import subprocess
import sys

from testproject.servers import ROOT


def test_demo_runs_its_tasks_and_the_admin_lists_them(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TESTPROJECT_", "KEYED_QUEUE_"))}
    env["TESTPROJECT_DATA_DIR"] = str(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "testproject.demo.run", "--check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "demo ok: 20 tasks succeeded" in done.stdout
