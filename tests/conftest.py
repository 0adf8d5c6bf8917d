from __future__ import annotations

import hashlib
import itertools
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis

from django_keyed_queue.gate.clients import close
from testproject.servers import PostgresServer, RedisServer, Worker, persistent_redis
from testproject.userproject.project import UserProject
from tests.gate_redis import ON_CLUSTER, connect_to
from tests.redis_connections import disconnect_clients
from tests.userproject.timings import LEASE_SECONDS


@pytest.fixture(scope="session")
def redis_server():
    server = RedisServer(os.environ["TESTPROJECT_REDIS_URL"], Path(os.environ["TESTPROJECT_DATA_DIR"]) / "redis")
    server.start()
    yield server
    disconnect_clients({urlsplit(server.url).port})
    server.stop()


def pytest_unconfigure(config):
    """After every fixture (the test database too) is torn down: keep the logs, drop the temp dir."""
    from django_keyed_queue.process.state import current
    from tests.settings import stop_database_server

    current().recorder.discard()  # the database is gone: the exit-time flush of what was buffered would fail
    stop_database_server()  # before its log is copied and its socket's directory goes
    data_dir = Path(os.environ["TESTPROJECT_DATA_DIR"])
    if not data_dir.exists():
        return
    if config.getoption("numprocesses", default=None) and not os.environ.get("PYTEST_XDIST_WORKER"):
        shutil.rmtree(data_dir, ignore_errors=True)  # a parallel run's controller ran no test: its workers keep theirs
        return
    artifacts = Path(__file__).resolve().parent.parent / "test-artifacts"
    if os.environ.get("KEYED_QUEUE_TESTS_DATABASE") == "postgresql":
        artifacts /= "postgresql"  # beside the default run's artifacts, which run first
    if os.environ.get("PYTEST_XDIST_WORKER"):
        artifacts /= os.environ["PYTEST_XDIST_WORKER"]  # each worker of a parallel run keeps its own
    shutil.rmtree(artifacts, ignore_errors=True)
    shutil.copytree(data_dir, artifacts, ignore=shutil.ignore_patterns("*.sqlite3*", "*.rdb", "*.aof"))
    shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def django_db_modify_db_settings_xdist_suffix():
    """No suffix on a parallel run's test databases: each worker has a temp dir and a database server of its
    own (tests/settings.py), and the processes a test starts must find the database by its settings' name."""


@pytest.fixture(scope="session", autouse=True)
def _postgresql_test_database_can_be_dropped(request):
    """Tests' threads leave connections open; PostgreSQL drops no database that sessions use."""
    if os.environ.get("KEYED_QUEUE_TESTS_DATABASE") != "postgresql":
        yield
        return
    request.getfixturevalue("django_db_setup")  # so this ends before the test database is dropped
    yield
    from django.db import connection

    with request.getfixturevalue("django_db_blocker").unblock(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )


@pytest.fixture
def gate_db() -> int:
    """The gate's database: the workers' (0) where tests run real workers; tiers without them override it."""
    return 0


@pytest.fixture(scope="session")
def gate_cluster(tmp_path_factory):
    """A local Redis Cluster of 3 masters, for the tiers' runs on a cluster."""
    from testproject.topologies import LocalCluster

    with LocalCluster(tmp_path_factory.mktemp("cluster")) as cluster:
        yield cluster
        disconnect_clients({node.port for node in cluster.nodes})


def _counts_added_first() -> None:
    """What this process counted for the metrics goes to Redis before a test empties it, not into the test
    (and after each test, while its Redis runs)."""
    state = sys.modules.get("django_keyed_queue.process.state")  # the gate tier's processes have no Django
    if state is not None:
        try:
            state.current().totals.flush()
        except Exception:  # a test left Redis unreachable: its counts go to a later test's Redis
            pass


if ON_CLUSTER:

    @pytest.fixture
    def gate_redis(request):
        """The cluster, emptied for each test."""
        cluster = request.getfixturevalue("gate_cluster")
        _counts_added_first()
        cluster.flushall()
        client = connect_to(cluster.url)
        yield client
        _counts_added_first()
        close(client)

else:

    @pytest.fixture
    def gate_redis(redis_server, gate_db) -> redis.Redis:
        """The gate's Redis database, emptied for each test (with the test history)."""
        client = redis.Redis.from_url(f"{redis_server.url}/{gate_db}")
        _counts_added_first()
        client.flushdb()
        redis.Redis.from_url(f"{redis_server.url}/3").flushdb()
        yield client
        _counts_added_first()  # and none is left to add at exit, when the server has stopped
        client.close()


@pytest.fixture(scope="session")
def workers(redis_server, django_db_setup, django_db_blocker):
    """Two real prefork celery workers of concurrency 2, shared by the tests that need them."""
    log_dir = Path(os.environ["TESTPROJECT_DATA_DIR"]) / "logs"
    # A local handoff budget (default 0.25 s) that a loaded machine cannot outrun in the handoff tests.
    handoff = {"KEYED_QUEUE_LOCAL_HANDOFF_SECONDS": "2"}
    started = [Worker(f"w{i}", log_dir, extra_env=handoff) for i in (1, 2)]
    try:
        for worker in started:
            worker.start()
        yield started
    finally:
        for worker in started:
            worker.kill()


# The user's project, made as a user makes one (testproject/userproject): the userproject and topologies tiers.


@pytest.fixture
def workdir(request) -> Path:
    """Kept with the run's artifacts: the project's worker logs and the Redis log. A long name is cut, with
    a digest of the whole, so that a test's parameters keep their own directories."""
    name = request.node.name
    if len(name) > 80:
        name = f"{name[:71]}-{hashlib.sha1(name.encode()).hexdigest()[:8]}"
    return Path(os.environ["TESTPROJECT_DATA_DIR"]) / "userproject" / name


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


_project_numbers = itertools.count(1)


@pytest.fixture(scope="session")
def user_postgres(tmp_path_factory) -> Iterator[PostgresServer]:
    """The PostgreSQL server of the user's projects that ask for one (a database each)."""
    server = PostgresServer(log_dir=Path(os.environ["TESTPROJECT_DATA_DIR"]) / "userproject-postgresql").start()
    yield server
    server.stop()


@pytest.fixture
def make_project(request, workdir, user_redis, project_template):
    """Builds the project with the install section's settings, plus ``settings`` a test adds; with
    ``database="postgresql"``, on a PostgreSQL database of its own instead of startproject's SQLite."""
    made: list[UserProject] = []

    def make(database: str = "sqlite", **settings) -> UserProject:
        settings = {"KEYED_QUEUE_LEASE_SECONDS": LEASE_SECONDS, **settings}
        if database not in ("sqlite", "postgresql"):
            raise ValueError(f"database={database!r}: use sqlite or postgresql")
        databases = None
        if database == "postgresql":
            server = request.getfixturevalue("user_postgres")
            name = f"mysite_{next(_project_numbers)}"  # the server is this process's own
            server.create_database(name)
            databases = {
                "ENGINE": "django.db.backends.postgresql", "NAME": name, "USER": server.user,
                "HOST": str(server.directory), "PORT": str(server.port),
            }  # fmt: skip
        project = UserProject(workdir / "mysite", user_redis.url, settings, databases)
        made.append(project.build(project_template))
        return project

    yield make
    for project in made:
        project.kill()
