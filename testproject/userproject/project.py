"""A Django project made the way a user makes one, to prove the app where users run it.

``django-admin startproject mysite``, ``manage.py startapp shop``, then the code
blocks of the README's install section, each into the file it names (Celery's
documented Django layout: ``mysite/celery.py`` with ``config_from_object`` and
``autodiscover_tasks()``, imported from ``mysite/__init__.py``), Celery's default
settings, one redis-server for the broker and the gate, the default SQLite
database (or, as a user switches, ``DATABASES`` pointed at a PostgreSQL database). The tier's own tasks
and settings (its pools), and a test's settings, are added after them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

from testproject.servers import Worker

FILES = Path(__file__).resolve().parent / "files"
README = Path(__file__).resolve().parents[2] / "README.md"
#: Where the README's install blocks point Redis; a project points them at its test server instead.
README_REDIS = "redis://localhost:6379"


def install_blocks() -> list[tuple[str, str]]:
    """(file, code) of each Python block of the README's install section whose first line names its file."""
    text = README.read_text()
    section = text[text.index("## Install in your project") :]
    section = section[: section.index("\n### ")]  # the steps end where the first subsection starts
    return re.findall(r"```python\n# (\S+)\n(.*?)```", section, re.DOTALL)


class UserProject:
    def __init__(
        self, directory: Path, redis_url: str, settings: dict | None = None, database: dict | None = None
    ) -> None:
        self.directory = directory
        self.redis_url = redis_url
        #: Settings added after the install section's (a test's tighter timings, Celery's recommended ones).
        self.settings = settings or {}
        #: ``DATABASES["default"]`` of a PostgreSQL database, or None for startproject's SQLite.
        self.database = database
        self.workers: list[Worker] = []

    @property
    def env(self) -> dict[str, str]:
        # Only the user's own settings: nothing of the tests' environment reaches the project.
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KEYED_QUEUE_", "TESTPROJECT_", "DJANGO_"))}
        return {**env, "DJANGO_SETTINGS_MODULE": "mysite.settings"}

    def build(self, template: Path | None = None) -> UserProject:
        """Made from scratch, or copied from ``template`` (a project :meth:`make` built, the same steps);
        then pointed at this project's Redis, with its settings added."""
        if template is None:
            self.make()
        else:
            shutil.copytree(template, self.directory)
        for name, _ in install_blocks():
            path = self.directory / name
            path.write_text(path.read_text().replace(README_REDIS, self.redis_url))
        added = {**self.settings, **({"DATABASES": {"default": self.database}} if self.database else {})}
        with open(self.directory / "mysite" / "settings.py", "a") as settings:
            settings.writelines(f"{name} = {value!r}\n" for name, value in added.items())
        if self.database:
            self.manage("migrate", "--verbosity", "0")  # the template migrated its SQLite file only
        return self

    def make(self) -> None:
        """``startproject``, ``startapp``, the install blocks (their Redis URL as the README has it), the
        tier's tasks, ``migrate``: nothing that reaches Redis."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self.run([sys.executable, "-m", "django", "startproject", "mysite", "."])
        self.manage("startapp", "shop")
        for name, code in install_blocks():
            path = self.directory / name
            written = path.read_text() if path.exists() else ""  # by startproject or startapp
            path.write_text(written + ("\n" if written else "") + code)
        with open(self.directory / "mysite" / "settings.py", "a") as settings:
            settings.write("\n" + (FILES / "settings.py").read_text())
        with open(self.directory / "shop" / "tasks.py", "a") as tasks:
            tasks.write("\n" + (FILES / "tasks.py").read_text())
        with open(self.directory / "shop" / "models.py", "a") as models:
            models.write("\n" + (FILES / "models.py").read_text())
        shutil.copy(FILES / "eager_tests.py", self.directory / "shop" / "tests.py")
        shutil.copy(FILES / "produce.py", self.directory / "produce.py")
        self.manage("makemigrations", "shop", "--verbosity", "0")
        self.manage("migrate", "--verbosity", "0")

    def run(
        self, command: list[str], check: bool = True, timeout: float = 120, env: dict | None = None
    ) -> subprocess.CompletedProcess:
        """``command`` in the project's directory and environment (plus ``env``)."""
        done = subprocess.run(
            command,
            cwd=self.directory,
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(command[1:])} exited {done.returncode}:\n{done.stdout}{done.stderr}")
        return done

    def manage(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return self.run([sys.executable, "manage.py", *args], check=check)

    def worker(self, name: str, concurrency: int = 2, pool: str = "") -> Worker:
        """A worker started as Celery's docs say: ``celery -A mysite worker -l INFO``, named for the host
        (``pool``: Celery's ``--pool``, else its default, prefork)."""
        [worker] = self.start_workers(name, concurrency=concurrency, pool=pool)
        return worker

    def start_workers(self, *names: str, concurrency: int = 2, pool: str = "") -> list[Worker]:
        """Workers started as :meth:`worker` starts one, all at once (each waits out Celery's mingle once,
        not once after another)."""
        workers = [
            Worker(
                name,
                self.directory / "logs",
                concurrency=concurrency,
                args=(f"--pool={pool}",) if pool else (),
                project="mysite",
                cwd=self.directory,
                base_env=self.env,
            )
            for name in names
        ]
        for worker in workers:
            self.workers.append(worker.launch())
        return [worker.wait_ready() for worker in workers]

    def produce(
        self, task: str, tasks: int, keys: int, interval: float, seconds: float | str, prefix: str = "acct"
    ) -> subprocess.Popen:
        """A producer process submitting round-robin over keys ``prefix:0``, ``prefix:1``... (see files/produce.py);
        each task lasts ``seconds``, or a random time in a ``"LOW-HIGH"`` range, or the i-th of a list ``"8,0.1"``
        (the rest its last)."""
        command = [sys.executable, "produce.py", task, str(tasks), str(keys), str(interval), str(seconds), prefix]
        return subprocess.Popen(command, cwd=self.directory, env=self.env, stdout=subprocess.PIPE, text=True)

    @staticmethod
    def accepted(producer: subprocess.Popen, timeout: float = 120) -> list[dict]:
        """A producer's accepted submissions, once it is done: {"key", "n", "id", "t"} in submission order."""
        out, _ = producer.communicate(timeout=timeout)
        if producer.returncode != 0:
            raise RuntimeError(f"the producer failed (exit {producer.returncode}): see its stderr above")
        return [json.loads(line) for line in out.splitlines()]

    def history(self) -> list[dict]:
        path = self.directory / "history.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]

    def ended(self, until: float | None = None) -> set[str]:
        """Ids of the tasks with an end line in the history (written at ``until`` or before, if given)."""
        return {e["id"] for e in self.history() if e["event"] == "end" and (until is None or e["t"] <= until)}

    def rows(self) -> dict[str, dict]:
        """Every KeyedTask row, by task id, read straight from the project's database."""
        query = "SELECT * FROM keyed_queue_keyedtask"
        if self.database:
            import psycopg
            from psycopg.rows import dict_row

            db = self.database
            with psycopg.connect(host=db["HOST"], port=db["PORT"], user=db["USER"], dbname=db["NAME"]) as conn:
                return {r["task_id"]: r for r in conn.cursor(row_factory=dict_row).execute(query)}
        with closing(sqlite3.connect(self.directory / "db.sqlite3", timeout=30)) as db:  # `with` alone leaves it open
            db.row_factory = sqlite3.Row
            return {r["task_id"]: dict(r) for r in db.execute(query)}

    def kill(self) -> None:
        for worker in self.workers:
            worker.kill()
