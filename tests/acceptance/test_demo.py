"""The README's demo command works: its own redis-server, SQLite, a worker and the admin.

A check run (``--check``) and then a served run share one data directory, as two
``make demo`` in a row do; the operator commands the demo prints are run as
printed, from an environment holding nothing of the demo.
"""

from __future__ import annotations

import http.cookiejar
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from contextlib import closing
from pathlib import Path

import pytest

from testproject.demo.run import READY, keep_records_and_gate_together
from testproject.servers import ROOT, free_port

pytestmark = pytest.mark.workers


def demo_env(data_dir: Path) -> dict:
    """This environment without the tests' own servers: the demo starts its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TESTPROJECT_", "KEYED_QUEUE_"))}
    return {**env, "TESTPROJECT_DATA_DIR": str(data_dir)}


class Demo:
    """``python -m testproject.demo.run`` serving the admin, its output read as it comes."""

    def __init__(self, data_dir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # Its own session, as a shell gives a job: signals sent to its group reach the demo alone
        # unless it put a child there.
        self.process = subprocess.Popen(
            [sys.executable, "-u", "-m", "testproject.demo.run", "--port", str(self.port)],
            cwd=ROOT,
            env=demo_env(data_dir),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_ready(self, timeout: float = 40) -> None:
        deadline = time.monotonic() + timeout
        while READY not in self.output:
            assert self.process.poll() is None, f"the demo ended ({self.process.returncode}):\n{self.output}"
            assert time.monotonic() < deadline, f"the demo was not ready in {timeout} s:\n{self.output}"
            time.sleep(0.1)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(30)
        self.reader.join(10)
        self.process.stdout.close()


def descendants(pid: int) -> dict[int, tuple[str, str]]:
    """Every process below ``pid``: {pid: (start time, command line)}, from /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # ended meanwhile
            parents[int(entry.name)] = int(fields[1])
    found, todo = {}, [pid]
    while todo:
        parent = todo.pop()
        for child in [p for p, pp in parents.items() if pp == parent]:
            found[child] = (_start_time(child), _cmdline(child))
            todo.append(child)
    return found


def _start_time(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except OSError:
        return ""


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def alive(pid: int, start_time: str) -> bool:
    """The same process (not a later one with its pid) still runs (a zombie has ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return stat[19] == start_time and stat[0] != "Z"


def rows(data_dir: Path, sql: str, *params) -> list[dict]:
    """Rows of the demo's database, read beside the demo (SQLite in WAL mode)."""
    with closing(sqlite3.connect(data_dir / "db.sqlite3", timeout=30)) as db:  # `with` alone leaves it open
        db.row_factory = sqlite3.Row
        return [dict(row) for row in db.execute(sql, params)]


def admin_pages(base: str, paths: list[str]) -> dict[str, str]:
    """Log in as admin/admin and fetch each page."""
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))

    def fetch(path: str, form: dict | None = None) -> str:
        data = urllib.parse.urlencode(form).encode() if form is not None else None
        with opener.open(f"{base}{path}", data, timeout=10) as response:
            return response.read().decode()

    fetch("/admin/login/")
    token = next(c.value for c in jar if c.name == "csrftoken")
    fetch("/admin/login/", {"username": "admin", "password": "admin", "csrfmiddlewaretoken": token, "next": "/admin/"})
    return {path: fetch(path) for path in paths}


# -- a check run, then a served run in the same data directory ------------------------------


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("demo")


@pytest.fixture(scope="module")
def check_run(data_dir):
    return subprocess.run(
        [sys.executable, "-m", "testproject.demo.run", "--check"],
        cwd=ROOT,
        env=demo_env(data_dir),
        capture_output=True,
        text=True,
        timeout=180,
    )


@pytest.fixture(scope="module")
def demo(data_dir, check_run):
    """The served demo, once ready; with what its admin showed then (the commands' test changes it)."""
    assert check_run.returncode == 0, check_run.stdout + check_run.stderr
    served = Demo(data_dir)
    try:
        served.wait_ready()
        printed = dict(re.findall(r"^  ([a-z ]+): +(http://\S+)$", served.output, re.MULTILINE))
        served.pages = admin_pages(served.url, [urllib.parse.urlsplit(url).path for url in printed.values()])
        served.printed = printed
        served.tasks = rows(data_dir, "SELECT * FROM keyed_queue_keyedtask ORDER BY id")
        served.idempotency = rows(data_dir, "SELECT * FROM keyed_queue_idempotencykey")
        yield served
    finally:
        served.stop()


def test_the_check_run_runs_its_tasks_and_the_admin_lists_them(check_run):
    assert check_run.returncode == 0, check_run.stdout + check_run.stderr
    assert "demo ok: 20 tasks succeeded" in check_run.stdout


def test_the_demo_leaves_something_to_look_at(demo):
    def tasks(name: str, **where) -> list[dict]:
        found = [t for t in demo.tasks if t["task_name"] == f"testproject.demo.tasks.{name}"]
        return [t for t in found if all(t[field] == value for field, value in where.items())]

    assert {t["status"] for t in tasks("sync_account", key="account:6")} == {"waiting"}  # behind the pause
    assert {t["status"] for t in tasks("build_report")} == {"running", "waiting"}
    [first, second] = tasks("send_invoice", status="failed")  # one a run, each on a key of its own
    assert (first["key"], second["key"]) == ("invoice:42", "invoice:43")
    assert second["error"].startswith("ValueError: invoice 43 has no billing address\n\nTraceback")
    assert len(tasks("deliver_webhook", status="succeeded", attempts=2)) == 2
    [charge] = tasks("charge")  # submitted twice in each of the two runs: one task
    [key] = [k for k in demo.idempotency if k["task_id"] == charge["task_id"]]
    assert f"one task: {charge['task_id']}" in demo.output

    # The pages the demo printed show those scenes.
    assert set(demo.printed) == {"tasks", "live keys", "failed task", "idempotency keys", "health"}
    page = lambda label: demo.pages[urllib.parse.urlsplit(demo.printed[label]).path]  # noqa: E731
    assert "report:monthly" in page("live keys") and "account:6" in page("live keys")
    assert "ValueError: invoice 43 has no billing address" in page("failed task")
    assert key["task_id"] in page("idempotency keys") and key["fingerprint"] not in page("idempotency keys")
    assert json.loads(page("health"))["stuck_keys"] >= 1  # the paused key with tasks waiting


def test_a_second_run_goes_on_from_the_first_runs_tickets(demo):
    """The gate's Redis keeps its data beside the database: no ticket number is handed out twice."""
    tickets = [(t["key"], t["ticket"]) for t in demo.tasks if t["ticket"] is not None]
    assert len(tickets) == len(set(tickets))
    assert sorted(n for key, n in tickets if key == "account:1") == list(range(1, 7)), "three in each run"


def test_the_printed_operator_commands_work_with_nothing_exported(demo, data_dir):
    block = demo.output.split("operator commands, in another terminal:\n", 1)[1].split("\n\n", 1)[0]
    cd, *commands = [line.strip() for line in block.splitlines()]
    assert cd == f"cd {ROOT}"
    bare = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/")}  # no TESTPROJECT_*, no venv

    def run(command: str) -> str:
        done = subprocess.run(["bash", "-c", f"{cd} && {command}"], env=bare, capture_output=True, text=True)
        assert done.returncode == 0, f"{command}\n{done.stdout}{done.stderr}"
        return done.stdout

    status, key_status, resume, pause, reap = commands
    assert "redis: reachable" in run(status)
    assert "key 'account:6': paused" in (shown := run(key_status)) and "waiting tickets: [" in shown
    assert "resumed 'account:6'" in run(resume)
    deadline = time.monotonic() + 30
    query = "SELECT status FROM keyed_queue_keyedtask WHERE key = 'account:6'"
    while {row["status"] for row in rows(data_dir, query)} != {"succeeded"}:
        assert time.monotonic() < deadline, rows(data_dir, query)
        time.sleep(0.2)
    assert "paused 'account:6'" in run(pause)
    assert "dry run: " in run(reap)


# -- stopping -------------------------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_a_stop_signal_stops_everything_the_demo_started(tmp_path, signum):
    demo = Demo(tmp_path)
    started: dict[int, tuple[str, str]] = {}
    try:
        demo.wait_ready()
        started = descendants(demo.process.pid)
        commands = [cmdline for _, cmdline in started.values()]
        assert sum("redis-server" in c for c in commands) == 1, commands
        assert sum("celery" in c and "demo@" in c for c in commands) == 4, "the worker and its 3 child processes"
        with urllib.request.urlopen(f"{demo.url}/admin/login/", timeout=10) as page:  # the web server answers
            assert page.status == 200
        if signum == signal.SIGINT:
            os.killpg(demo.process.pid, signum)  # Ctrl-C: the terminal signals the job's process group
        else:
            os.kill(demo.process.pid, signum)  # kill -TERM / kill -HUP: the demo alone
        # Ctrl-C ends the demo cleanly (`make demo` exits 0); a signal from elsewhere is told by the status.
        assert demo.process.wait(30) == (0 if signum == signal.SIGINT else 128 + signum), demo.output
        deadline = time.monotonic() + 10
        while survivors := {pid: cmd for pid, (start, cmd) in started.items() if alive(pid, start)}:
            assert time.monotonic() < deadline, f"still running after {signum.name}: {survivors}"
            time.sleep(0.1)
        with pytest.raises(OSError):
            urllib.request.urlopen(f"{demo.url}/admin/login/", timeout=2)
        assert not (tmp_path / "redis-url").exists(), "the demo's Redis URL is gone with it"
    finally:  # what is left when the test failed
        left = {**started, **(descendants(demo.process.pid) if demo.process.poll() is None else {})}
        demo.stop()
        for pid, (start, _) in left.items():
            if alive(pid, start):
                os.kill(pid, signal.SIGKILL)


# -- the records and the gate start together --------------------------------------------------


def test_records_without_their_gate_are_moved_aside(tmp_path):
    db = tmp_path / "db.sqlite3"
    db.write_text("rows")
    (tmp_path / "db.sqlite3-wal").write_text("more rows")
    said = keep_records_and_gate_together(db, tmp_path / "redis")
    assert not db.exists() and len(said) == 1
    [aside] = tmp_path.glob("db-*.sqlite3")
    assert aside.read_text() == "rows" and Path(f"{aside}-wal").read_text() == "more rows"


def test_a_gate_without_its_records_is_removed(tmp_path):
    (tmp_path / "redis" / "appendonlydir").mkdir(parents=True)
    said = keep_records_and_gate_together(tmp_path / "db.sqlite3", tmp_path / "redis")
    assert not (tmp_path / "redis" / "appendonlydir").exists() and len(said) == 1


def test_records_beside_their_gate_are_kept(tmp_path):
    (tmp_path / "redis" / "appendonlydir").mkdir(parents=True)
    (tmp_path / "db.sqlite3").write_text("rows")
    assert keep_records_and_gate_together(tmp_path / "db.sqlite3", tmp_path / "redis") == []
    assert (tmp_path / "db.sqlite3").exists() and (tmp_path / "redis" / "appendonlydir").exists()
