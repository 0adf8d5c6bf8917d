"""A built wheel carries the Lua scripts, and the gate loads them from it through importlib.resources."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = "django_keyed_queue"
LUA_DIR = REPO / PACKAGE / "gate" / "lua"


def _can_build_without_isolation() -> bool:
    """setuptools builds wheels itself from 70.1 on; before that it needs the ``wheel`` package."""
    if importlib.util.find_spec("setuptools") is None:
        return False
    if importlib.util.find_spec("wheel") is not None:
        return True
    import setuptools

    return tuple(int(p) for p in setuptools.__version__.split(".")[:2]) >= (70, 1)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from a copy of the repository's package and top-level files.

    A copy, because a build writes build/ and egg-info into its source tree; and only the
    package (the one setup.cfg finds) and the top-level files, not a virtualenv or caches.
    """
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"
    shutil.copytree(REPO / PACKAGE, source / PACKAGE, ignore=shutil.ignore_patterns("__pycache__"))
    for path in REPO.iterdir():
        if path.is_file():
            shutil.copy2(path, source / path.name)
    # -v shows the build backend's warnings (test_the_build_is_quiet reads them).
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-input", "-v", "-w", str(tmp / "out")]
    if _can_build_without_isolation():
        command.append("--no-build-isolation")
    # Otherwise pip installs the build requirements of pyproject.toml into an isolated environment.
    built = subprocess.run([*command, str(source)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, f"{' '.join(command)} failed:\n{built.stdout}\n{built.stderr}"
    (wheel,) = (tmp / "out").glob("django_keyed_queue-*.whl")
    (tmp / "build.log").write_text(built.stdout + built.stderr)
    return wheel


def test_the_build_is_quiet(wheel):
    """setuptools warns about every data folder it finds outside its ``packages``: none may be."""
    log = (wheel.parent.parent / "build.log").read_text()
    assert "Building wheel" in log, "the log is the build's"
    assert "would be ignored" not in log and "absent from the `packages`" not in log, log


def test_the_repository_has_the_scripts_the_gate_loads():
    from django_keyed_queue.gate.scripts import SCRIPT_NAMES

    on_disk = {p.relative_to(LUA_DIR).as_posix() for p in LUA_DIR.rglob("*.lua")}
    assert {f"{name}.lua" for name in SCRIPT_NAMES} <= on_disk
    assert "includes/common.lua" in on_disk


def test_the_wheel_carries_every_lua_file(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        for path in sorted(LUA_DIR.rglob("*.lua")):
            inside = path.relative_to(REPO).as_posix()
            assert inside in names, f"{inside} is missing from {wheel.name}"
            assert archive.read(inside) == path.read_bytes()


def test_the_gate_loads_its_scripts_from_the_wheel(wheel, tmp_path):
    """Import the package from the wheel itself (a zip on sys.path) and assemble every script."""
    check = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(wheel)!r})
        from django_keyed_queue.gate import scripts
        assert scripts.__file__.startswith({str(wheel)!r}), scripts.__file__
        for name in scripts.SCRIPT_NAMES:
            text = scripts.source(name)
            assert "@include" not in text, name
            assert text.startswith("--[[") and "redis.call" in text, name
            print(name, len(text))
        """
    )
    # -I: neither the working directory nor PYTHONPATH may bring in the repository's copy.
    ran = subprocess.run([sys.executable, "-I", "-c", check], capture_output=True, text=True, cwd=tmp_path, timeout=60)

    assert ran.returncode == 0, ran.stderr
    from django_keyed_queue.gate.scripts import SCRIPT_NAMES

    assert [line.split()[0] for line in ran.stdout.splitlines()] == list(SCRIPT_NAMES)
