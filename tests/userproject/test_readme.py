"""The README's install section, followed as written: a keyed task runs and shows in the admin.

Every project of this tier is built from the section's code blocks (see project.py); this test
also runs its commands and checks the pages a newcomer opens next.
"""

import json
import os
import re
import shlex
import sys

import pytest

from testproject.userproject.project import README, install_blocks
from tests.waiting import wait_until

pytestmark = pytest.mark.workers


def install_commands() -> list[str]:
    """The lines of the install section's shell block that runs the project."""
    section = README.read_text().split("## Install in your project", 1)[1].split("\n### ", 1)[0]
    (block,) = [b for b in re.findall(r"```sh\n(.*?)```", section, re.DOTALL) if "manage.py migrate" in b]
    return [line.split("  #")[0].strip() for line in block.splitlines()]


def test_the_install_section_names_every_file_it_changes():
    assert [name for name, _ in install_blocks()] == [
        "mysite/settings.py",
        "mysite/celery.py",
        "mysite/__init__.py",
        "mysite/urls.py",
        "shop/tasks.py",
    ]


PAGES = """
from django.contrib.auth.models import User
from django.test import Client
from django.test.utils import setup_test_environment
import json

setup_test_environment()  # lets the test client's host in
client = Client()
client.force_login(User.objects.get(username="admin"))
tasks = client.get("/admin/keyed_queue/keyedtask/")
health = client.get("/keyed-queue/health/")
print(json.dumps({"tasks": [tasks.status_code, tasks.content.decode()], "health": [health.status_code, health.json()]}))
"""


def test_a_newcomer_following_the_readme_sees_a_keyed_task_succeed_in_the_admin(make_project):
    commands = install_commands()
    assert commands[:3] == [
        "python manage.py migrate",
        "python manage.py createsuperuser",
        "celery -A mysite worker -l INFO",
    ]
    project = make_project()  # startproject, startapp, the blocks, migrate
    project.run(
        [
            sys.executable,
            "manage.py",
            "createsuperuser",
            "--noinput",
            "--username",
            "admin",
            "--email",
            "admin@example.com",
        ],
        env={"DJANGO_SUPERUSER_PASSWORD": "admin"},
    )
    project.worker("a")  # celery -A mysite worker -l INFO, as the README runs it
    (submit,) = [c for c in commands if c.startswith("python manage.py shell")]
    project.run([sys.executable, *shlex.split(submit)[1:]])

    def succeeded():
        return [r for r in project.rows().values() if r["key"] == "account:7" and r["status"] == "succeeded"]

    wait_until(succeeded, 30, 0.2, "the README's task to succeed")
    assert "syncing account 7" in project.workers[0].log()

    shown = json.loads(project.manage("shell", "-c", PAGES).stdout.splitlines()[-1])
    status, page = shown["tasks"]
    assert status == 200 and "account:7" in page and "shop.tasks.sync_account" in page
    status, report = shown["health"]
    assert status == 200 and report["redis_reachable"] is True and report["queue_depth"] == 0
    assert os.path.exists(project.directory / "db.sqlite3"), "the default SQLite database"
