"""The user's project tier: a project made as a user makes one, its own redis-server for broker and gate."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from testproject.servers import persistent_redis

from .project import UserProject

#: The lease the tier's projects set: short enough that recoveries happen within a test.
LEASE_SECONDS = 3


@pytest.fixture
def workdir(request) -> Path:
    """Kept with the run's artifacts: the project's worker logs and the Redis log."""
    return Path(os.environ["TESTPROJECT_DATA_DIR"]) / "userproject" / request.node.name[:80]


@pytest.fixture
def user_redis(workdir):
    with persistent_redis(workdir / "redis") as server:
        yield server


@pytest.fixture(scope="session")
def project_template(tmp_path_factory) -> Path:
    """The tier's project made once; each test copies it (making one takes seconds)."""
    directory = tmp_path_factory.mktemp("userproject") / "mysite"
    UserProject(directory, redis_url="").make()
    return directory


@pytest.fixture
def make_project(workdir, user_redis, project_template):
    """Builds the project with the install section's settings, plus ``settings`` a test adds."""
    made: list[UserProject] = []

    def make(**settings) -> UserProject:
        settings = {"KEYED_QUEUE_LEASE_SECONDS": LEASE_SECONDS, **settings}
        project = UserProject(workdir / "mysite", user_redis.url, settings)
        made.append(project.build(project_template))
        return project

    yield make
    for project in made:
        project.kill()
