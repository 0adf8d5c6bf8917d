"""Processes submitting the same charge at the same instant: one task, run once."""

import os
import subprocess
import sys
import time

import pytest

from testproject.demo.history import read as read_history
from testproject.servers import ROOT
from tests.waiting import wait_for_records

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.workers]


def test_processes_racing_on_one_fingerprint_run_it_once(workers, gate_redis):
    at = time.time() + 3  # every process is up and waiting by then
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "testproject.settings"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.submit_at", str(at), "42"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for _ in range(6)
    ]
    ids = {proc.communicate(timeout=60)[0].strip() for proc in procs}
    assert all(proc.returncode == 0 for proc in procs)
    assert len(ids) == 1, f"every submission resolves to one task, got {ids}"
    records = wait_for_records(ids)
    assert [r.status for r in records.values()] == ["succeeded"]
    time.sleep(1)  # a second run, if there were one, would have started by now
    assert [e["key"] for e in read_history() if e["event"] == "start"] == ["order:42"]
