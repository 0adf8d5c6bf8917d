"""The docs site builds in strict mode: every page of the nav, the README's sections, the settings
table generated from conf.py, and the API reference generated from the docstrings."""

from __future__ import annotations

import ast
import html
import importlib.util
import inspect
import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from django_keyed_queue import exceptions
from django_keyed_queue.conf import DEFAULTS, PREFIX

REPO = Path(__file__).resolve().parents[1]
#: README sections the site leaves out of the quickstart, having pages of their own (docs/hooks/readme.py).
SECTIONS_ELSEWHERE = {"Settings", "Documentation"}


def build(config: Path, site_dir: Path) -> subprocess.CompletedProcess:
    assert importlib.util.find_spec("mkdocs") is not None, "mkdocs is missing: pip install -e '.[docs]'"
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config)]
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [*command, "--site-dir", str(site_dir)], cwd=config.parent, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    built = build(REPO / "mkdocs.yml", out)
    assert built.returncode == 0, built.stderr
    return out


def page(site: Path, source: str) -> str:
    """The HTML of the page built from ``source`` (a path under docs/), as MkDocs places it."""
    stem = source.removesuffix(".md")
    built = site / ("index.html" if stem == "index" else f"{stem}/index.html")
    assert built.is_file(), f"{source} was not built ({built.relative_to(site)} is missing)"
    return built.read_text(encoding="utf-8")


def nav_pages(nav) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    items = nav.values() if isinstance(nav, dict) else nav
    return [source for item in items for source in nav_pages(item)]


class Tables(HTMLParser):
    """The rows of a page's tables, each cell as its text and the texts of its code spans."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[tuple[str, list[str]]]] = []
        self._cell: list[str] | None = None
        self._codes: list[str] = []
        self._code: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self._cell, self._codes = [], []
        elif tag == "code" and self._cell is not None:
            self._code = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append(("".join(self._cell).strip(), self._codes))
            self._cell = None
        elif tag == "code" and self._code is not None:
            self._codes.append("".join(self._code))
            self._code = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)
        if self._code is not None:
            self._code.append(data)


def test_every_page_of_the_nav_is_built(site):
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    sources = nav_pages(config["nav"])
    assert {"index.md", "quickstart.md", "settings.md", "api.md", "changelog.md"} <= set(sources)
    for source in sources:
        article = re.search(r"<article[^>]*>(.*?)</article>", page(site, source), re.S)
        assert article and re.search(r"<h1", article.group(1)), f"{source}: no article with a title"
    assert (site / "benchmarks.png").is_file()


def test_the_home_page_and_the_quickstart_are_the_readme(site):
    readme = (REPO / "README.md").read_text()
    titles = [line[3:].strip() for line in readme.splitlines() if line.startswith("## ")]
    both = page(site, "index.md") + page(site, "quickstart.md")
    found = re.findall(r"<h[1-6][^>]*>(.*?)</h[1-6]>", both, re.S)
    headings = {html.unescape(re.sub(r"<[^>]+>", "", heading)).strip(" ¶\n") for heading in found}
    for title in titles:
        if title not in SECTIONS_ELSEWHERE:
            assert re.sub(r"`", "", title) in headings, f"README section {title!r} is on neither page"
    assert 'href="docs/' not in both and 'href="../docs/' not in both


def test_the_settings_page_lists_every_setting_with_its_default(site):
    parser = Tables()
    parser.feed(page(site, "settings.md"))
    rows = {cells[0][0]: cells for cells in parser.rows if len(cells) == 3 and cells[0][0].startswith(PREFIX)}
    assert set(rows) == {PREFIX + name for name in DEFAULTS}
    for name, default in DEFAULTS.items():
        (_, _), (_, codes), (meaning, _) = rows[PREFIX + name]
        assert codes and ast.literal_eval(codes[0]) == default, (
            f"{name}: the page shows {codes}, conf.py has {default!r}"
        )
        assert meaning, f"{name} has no meaning on the page"


def test_the_api_page_documents_the_public_api_and_every_exception(site):
    api = page(site, "api.md")
    for anchor in ("keyed_serial_task", "KeyedSerialTask", "KeyedSerialTask.holds_key", "KeyedSerialTask.key_for"):
        assert f'id="django_keyed_queue.{anchor}"' in api, anchor
    errors = [
        name for name, cls in inspect.getmembers(exceptions, inspect.isclass) if cls.__module__ == exceptions.__name__
    ]
    assert "KeyedQueueError" in errors
    for name in errors:
        assert f'id="django_keyed_queue.exceptions.{name}"' in api, name


def test_strict_mode_fails_on_a_broken_anchor(tmp_path):
    """The site's validation settings make a link to a missing heading fail the build."""
    for name in ("mkdocs.yml", "README.md"):
        shutil.copy2(REPO / name, tmp_path / name)
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(REPO / "docs", tmp_path / "docs", ignore=ignore)
    shutil.copytree(REPO / "django_keyed_queue", tmp_path / "django_keyed_queue", ignore=ignore)
    with (tmp_path / "docs" / "changelog.md").open("a") as changelog:
        changelog.write("\nSee [the gate](guarantees.md#no-such-heading).\n")

    built = build(tmp_path / "mkdocs.yml", tmp_path / "site")

    assert built.returncode != 0
    assert "does not contain an anchor '#no-such-heading'" in built.stderr, built.stderr


def hook(name: str):
    """A module of docs/hooks/, loaded by path as MkDocs loads it."""
    spec = importlib.util.spec_from_file_location(f"docs_hook_{name}", REPO / "docs" / "hooks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_links_are_made_to_work_on_the_site(tmp_path):
    (tmp_path / "README.md").write_text(
        "# Name\n\nIntro, see [Delayed](#delayed) and [docs/soak.md](docs/soak.md#limits).\n\n"
        "## Try it\n\n```sh\n## not a section: [x](docs/a.md)\n```\n\n"
        "## Install in your project\n\nSee [Settings](#settings), [tests](tests/userproject/)"
        " and [`tests/x.py`](tests/x.py), `[code](docs/b.md)`.\n\n### Delayed\n\nBack to [Try it](#try-it).\n\n"
        "## Settings\n\n| a table |\n\n## Documentation\n\n- a list\n"
    )
    readme = hook("readme")
    config = SimpleNamespace(config_file_path=str(tmp_path / "mkdocs.yml"), repo_url=None, nav=[{"Soak": "soak.md"}])

    home = readme.on_page_markdown("<!-- README: home -->\n", None, config, None)
    quickstart = readme.on_page_markdown("# Quickstart\n<!-- README: quickstart -->\n", None, config, None)

    assert "[Delayed](quickstart.md#delayed)" in home and "[Soak](soak.md#limits)" in home
    assert "## not a section: [x](docs/a.md)" in home and "## Install" not in home
    assert quickstart.startswith("# Quickstart\n## Install in your project")
    assert "[Settings](settings.md)" in quickstart and "[Try it](index.md#try-it)" in quickstart
    assert "tests (`tests/userproject/`) and `tests/x.py`" in quickstart and "`[code](docs/b.md)`" in quickstart
    assert "a table" not in quickstart and "a list" not in quickstart
    config.repo_url = "https://example.org/repo/"
    quickstart = readme.on_page_markdown("<!-- README: quickstart -->", None, config, None)
    assert "[tests](https://example.org/repo/blob/main/tests/userproject/)" in quickstart


def test_the_admin_page_shows_the_screenshots_under_docs_screenshots(tmp_path):
    screenshots = hook("screenshots")
    admin = (REPO / "docs" / "admin.md").read_text()
    assert screenshots.MARKER in admin
    config, page = SimpleNamespace(docs_dir=str(tmp_path)), SimpleNamespace(file=SimpleNamespace(src_uri="admin.md"))

    assert screenshots.MARKER not in screenshots.on_page_markdown(
        admin, page, config, None
    )  # no screenshots yet: nothing
    (tmp_path / "screenshots").mkdir()
    for name in ("task-list-1280.png", "live_keys-1920.png", "notes.txt"):
        (tmp_path / "screenshots" / name).write_bytes(b"")
    shown = screenshots.on_page_markdown(admin, page, config, None)
    assert "## Screenshots" in shown
    assert "![Live keys 1920](screenshots/live_keys-1920.png)" in shown
    assert "![Task list 1280](screenshots/task-list-1280.png)" in shown
    assert "notes.txt" not in shown


def test_the_architecture_names_every_room_and_only_modules_there_are():
    """docs/architecture.md names each room of the package (its sub-packages) and each top-level module, and
    every module it names exists: a room added or a module gone fails here, not in a reader's hands."""
    text = (REPO / "docs" / "architecture.md").read_text()
    package = REPO / "django_keyed_queue"
    # Every sub-package, a room within a room too (ops/actions/): by its name and a slash.
    rooms = {p.parent.name for p in package.glob("*/**/__init__.py")} - {"migrations"}
    assert [room for room in sorted(rooms) if f"{room}/" not in text] == []
    modules = {p.name for p in package.glob("*.py")} - {"__init__.py"}
    assert [m for m in sorted(modules) if f"`{m}`" not in text] == []
    named = set(re.findall(r"`((?:[a-z_]+/)*[a-z_0-9]+\.py)`", text))
    every = {str(p.relative_to(package)) for p in package.rglob("*.py")} | {
        str(p.relative_to(REPO)) for p in (REPO / "tests").rglob("*.py")
    }
    missing = [n for n in sorted(named) if n not in every and not any(e.endswith(f"/{n}") for e in every)]
    assert missing == [], f"docs/architecture.md names modules that are gone: {missing}"
