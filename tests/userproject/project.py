"""A Django project made the way a user makes one, to prove the app where users run it.

``django-admin startproject mysite``, ``manage.py startapp shop``, Celery's
documented Django layout (``mysite/celery.py`` with ``config_from_object`` and
``autodiscover_tasks()``, imported from ``mysite/__init__.py``), Celery's default
settings, one redis-server for the broker and the gate, the default SQLite
database. Only what the README's install section asks for is added.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

from testproject.servers import Worker

FILES = Path(__file__).resolve().parent / "files"

CELERY_IMPORT = """
# This will make sure the app is always imported when
# Django starts so that shared_task will use this app.
from .celery import app as celery_app

__all__ = ("celery_app",)
"""


class UserProject:
    def __init__(self, directory: Path, redis_url: str, settings: dict | None = None) -> None:
        self.directory = directory
        self.redis_url = redis_url
        #: Settings added after the install section's (a test's tighter timings, Celery's recommended ones).
        self.settings = settings or {}
        self.workers: list[Worker] = []

    @property
    def env(self) -> dict[str, str]:
        # Only the user's own settings: nothing of the tests' environment reaches the project.
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KEYED_QUEUE_", "TESTPROJECT_", "DJANGO_"))}
        return {**env, "DJANGO_SETTINGS_MODULE": "mysite.settings"}

    def build(self) -> UserProject:
        self.directory.mkdir(parents=True, exist_ok=True)
        django_admin = [sys.executable, "-m", "django"]
        self._run([*django_admin, "startproject", "mysite", "."])
        self.manage("startapp", "shop")
        package = self.directory / "mysite"
        shutil.copy(FILES / "celery.py", package / "celery.py")
        with open(package / "__init__.py", "a") as init:
            init.write(CELERY_IMPORT)
        shutil.copy(FILES / "tasks.py", self.directory / "shop" / "tasks.py")
        shutil.copy(FILES / "produce.py", self.directory / "produce.py")
        added = {
            "CELERY_BROKER_URL": f"{self.redis_url}/0",
            "KEYED_QUEUE_REDIS_URL": f"{self.redis_url}/0",
            **self.settings,
        }
        with open(package / "settings.py", "a") as settings:
            settings.write('\nINSTALLED_APPS += ["django_keyed_queue", "shop"]\n')
            settings.writelines(f"{name} = {value!r}\n" for name, value in added.items())
        self.manage("migrate", "--verbosity", "0")
        return self

    def _run(self, command: list[str], check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        done = subprocess.run(
            command, cwd=self.directory, env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(command[1:])} exited {done.returncode}:\n{done.stdout}{done.stderr}")
        return done

    def manage(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return self._run([sys.executable, "manage.py", *args], check=check)

    def worker(self, name: str, concurrency: int = 2) -> Worker:
        """A worker started as Celery's docs say: ``celery -A mysite worker -l INFO``, named for the host."""
        worker = Worker(
            name,
            self.directory / "logs",
            concurrency=concurrency,
            args=(),
            project="mysite",
            cwd=self.directory,
            base_env=self.env,
        )
        self.workers.append(worker.start())
        return worker

    def produce(self, task: str, tasks: int, keys: int, interval: float, seconds: float) -> subprocess.Popen:
        """A producer process submitting round-robin over keys (see files/produce.py)."""
        command = [sys.executable, "produce.py", task, str(tasks), str(keys), str(interval), str(seconds)]
        return subprocess.Popen(command, cwd=self.directory, env=self.env, stdout=subprocess.PIPE, text=True)

    def history(self) -> list[dict]:
        path = self.directory / "history.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]

    def rows(self) -> dict[str, dict]:
        """Every KeyedTask row, by task id, read straight from the project's SQLite file."""
        with sqlite3.connect(self.directory / "db.sqlite3", timeout=30) as db:
            db.row_factory = sqlite3.Row
            return {r["task_id"]: dict(r) for r in db.execute("SELECT * FROM keyed_queue_keyedtask")}

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()
