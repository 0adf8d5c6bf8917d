"""The admin driven in headless Chromium (Debian's package) against the testproject's real server.

The server is ``manage.py runserver`` in a subprocess with the run's environment, so it opens
the same SQLite file as the tests (the test database is that file, see testproject/settings.py).
Tests here use ``django_db(transaction=True)``: what they write is committed, so the server sees it.
Screenshots go to the run's data dir, which the run copies to ``test-artifacts/screenshots/``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from testproject.servers import ROOT, free_port
from tests.browser.server import DATA_DIR, GATE_URL, SERVER_REAP_INTERVAL_SECONDS
from tests.gate_redis import WORKERLESS_GATE_DB

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
USERNAME, PASSWORD = "operator", "a-long-test-password"


@pytest.fixture
def gate_db() -> int:
    return WORKERLESS_GATE_DB


@pytest.fixture(autouse=True)
def _gate_without_workers(settings):
    """The tests' gate is the server's: GATE_URL."""
    settings.KEYED_QUEUE_REDIS_URL = GATE_URL


@pytest.fixture(scope="session")
def admin_server(django_db_setup, redis_server) -> str:
    """The base URL of the testproject served by ``runserver`` on a free port, its gate on the tests' Redis
    (started first: a task's page reads the gate, and a test that asks for no Redis of its own may be the
    first of its worker)."""
    port = free_port()
    log_path = DATA_DIR / "logs" / "runserver.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "testproject.settings",
        "TESTPROJECT_DEBUG": "1",  # runserver serves the admin's CSS only in debug
        # Transactional tests flush the database, renumbering the content types the server caches.
        "TESTPROJECT_FORGET_CONTENT_TYPES": "1",
        "TESTPROJECT_GATE_REDIS_URL": GATE_URL,
        "KEYED_QUEUE_REAP_INTERVAL_SECONDS": str(SERVER_REAP_INTERVAL_SECONDS),
    }
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "testproject.manage", "runserver", "--noreload", f"127.0.0.1:{port}"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"{url}/admin/login/", timeout=2) as response:
                if response.status == 200:
                    break
        except OSError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"runserver did not answer:\n{log_path.read_text(errors='replace')[-3000:]}")
        time.sleep(0.1)
    yield url
    process.terminate()
    process.wait(10)


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium from Debian's package (Playwright never downloads a browser here)."""
    from playwright.sync_api import sync_playwright

    executable = shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(executable).exists():
        pytest.fail("Chromium is not installed (Debian package chromium; `make test` installs it)")
    # Playwright's sync API keeps an asyncio loop running in this thread, so Django takes the
    # tests' plain ORM calls for calls from async code; they are not, so let them through.
    allowed = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    playwright = sync_playwright().start()
    try:
        chromium = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()
    finally:
        playwright.stop()
        if allowed is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = allowed


@pytest.fixture
def superuser(transactional_db):
    from django.contrib.auth import get_user_model

    return get_user_model().objects.create_superuser(USERNAME, "operator@example.com", PASSWORD)


@pytest.fixture
def page(browser, admin_server):
    """A fresh browser page (no cookies) whose relative URLs go to the server; 5 s to find anything."""
    context = browser.new_context(base_url=admin_server, viewport={"width": 1600, "height": 900})
    context.set_default_timeout(5000)
    page = context.new_page()
    yield page
    context.close()


@pytest.fixture
def screenshot(page, request):
    """``screenshot("name")`` saves the whole page as ``screenshots/<test>-<name>.png`` in the artifacts."""
    directory = DATA_DIR / "screenshots"
    directory.mkdir(parents=True, exist_ok=True)

    def take(name: str) -> Path:
        path = directory / f"{request.node.name}-{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return take


@pytest.fixture
def logged_in(page, superuser):
    """The page, logged in to the admin through its login form as the operator."""
    page.goto("/admin/login/?next=/admin/")
    page.fill("#id_username", USERNAME)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url("**/admin/")
    return page
