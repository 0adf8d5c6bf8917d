"""The Redis ACL rules docs/deployment.md gives, as the ACL file of a real redis-server: keyed tasks run
end to end through a worker started as Celery's docs say, and Redis' ACL log records no refusal.

Each set-up's lines are read from the docs, so the docs stay true. The worker runs with its mingle,
gossip and heartbeats (remote control's broadcast and reply queues, the event channels), and a
``celery inspect ping`` asks it over remote control. With a gate user beside a broker user, the
gate's push of a granted task's message is then refused on purpose: every task still runs, the
grants published in a second step, and each process says so once, at WARNING, with the fix.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from testproject.servers import RedisServer, free_port
from testproject.userproject.project import UserProject
from tests.redis_connections import disconnect_clients
from tests.userproject.run_checks import accepted_by, check_run
from tests.userproject.timings import LEASE_SECONDS

pytestmark = pytest.mark.workers

DEPLOYMENT = Path(__file__).resolve().parents[2] / "docs" / "deployment.md"
ONE_USER = "one user for the broker and the gate"
GATE_BESIDE_BROKER = "a gate user beside a broker user"
#: What the worker logs at its start when it pushes each grant in the call that grants it.
PUSHES = "the gate pushes each granted task's message onto Celery's queue in the same atomic call"
#: What a process logs the first time Redis refuses the gate's push for an ACL.
REFUSED = "an ACL refusal (NOPERM"


def acl_lines(title: str) -> list[str]:
    """The ACL file docs/deployment.md gives for ``title`` (the paragraph before its block begins so)."""
    blocks = re.findall(r"\n([^\n]*), `users\.acl`:\n\n```text\n(.*?)```", DEPLOYMENT.read_text(), re.DOTALL)
    (lines,) = [block.splitlines() for caption, block in blocks if caption.lower().startswith(title)]
    return lines


#: This test's own user, added to the docs' ACL file to read Redis' ACL log (the docs turn ``default`` off).
ADMIN_LINE = "user tests-admin on >tests-admin-secret ~* &* +@all"


def admin_client(server: RedisServer) -> redis.Redis:
    return redis.Redis(port=server.port, username="tests-admin", password="tests-admin-secret")


def test_each_block_pasted_whole_as_an_acl_file_starts_redis_with_default_off(workdir):
    """The docs' ACL files as a user pastes them: Redis starts, refuses ``default``, and takes each user."""
    for n, title in enumerate((ONE_USER, GATE_BESIDE_BROKER)):
        lines = acl_lines(title)
        assert lines[0] == "user default off", lines
        directory = workdir / f"pasted-{n}"
        directory.mkdir(parents=True)
        (directory / "users.acl").write_text("\n".join(lines) + "\n")
        server = RedisServer(f"redis://127.0.0.1:{free_port()}", directory)
        server.start("--aclfile", str(directory / "users.acl"))
        try:
            with pytest.raises(redis.AuthenticationError), redis.Redis(port=server.port) as anyone:
                anyone.ping()
            for line in lines[1:]:
                user = line.split()[1]
                with redis.Redis(port=server.port, username=user, password=password(lines, user)) as client:
                    assert client.ping(), user
        finally:
            server.stop()


def password(lines: list[str], user: str) -> str:
    (line,) = [line for line in lines if line.startswith(f"user {user} ")]
    return re.search(r" >(\S+)", line)[1]


@pytest.fixture
def acl_redis(workdir) -> Iterator[Callable[[list[str]], RedisServer]]:
    """A redis-server whose ACL file is the given lines, plus this test's own admin (``default``)."""
    started: list[RedisServer] = []

    def start(lines: list[str]) -> RedisServer:
        directory = workdir / "redis"
        directory.mkdir(parents=True, exist_ok=True)
        aclfile = directory / "users.acl"
        aclfile.write_text("\n".join([*lines, ADMIN_LINE]) + "\n")
        server = RedisServer(f"redis://127.0.0.1:{free_port()}", directory)
        started.append(server)
        server.start("--aclfile", str(aclfile))
        return server

    yield start
    for server in started:
        disconnect_clients({server.port})
        server.stop()


def refusals(server: RedisServer) -> list[dict]:
    with admin_client(server) as admin:
        return admin.acl_log()


def user_url(server: RedisServer, user: str, secret: str) -> str:
    return f"redis://{user}:{secret}@127.0.0.1:{server.port}"


def run_keyed_tasks(project: UserProject, prefix: str) -> None:
    """Keyed tasks on three keys, all run once and in order: each key's first is granted at its
    submission (the producer's gate call pushes it), the rest, submitted while it runs, by a finish (the
    worker's)."""
    producer = project.produce("step", tasks=9, keys=3, interval=0.01, seconds=0.3, prefix=prefix)
    check_run(project, accepted_by(producer), timeout=60)


def inspect_ping(project: UserProject) -> None:
    pinged = project.run([sys.executable, "-m", "celery", "-A", "mysite", "inspect", "ping", "-t", "5"], check=False)
    assert pinged.returncode == 0 and "pong" in pinged.stdout, pinged.stdout + pinged.stderr


def worker_log(project: UserProject) -> str:
    return "".join(worker.log() for worker in project.workers)


def test_one_acl_user_for_the_broker_and_the_gate(acl_redis, workdir, project_template):
    lines = acl_lines(ONE_USER)
    server = acl_redis(lines)
    url = user_url(server, "app", password(lines, "app"))
    project = UserProject(workdir / "mysite", url, {"KEYED_QUEUE_LEASE_SECONDS": LEASE_SECONDS})
    project.build(project_template)
    try:
        project.worker("a")
        run_keyed_tasks(project, "one")
        inspect_ping(project)
        assert refusals(server) == []
        log = worker_log(project)
        assert PUSHES in log and REFUSED not in log
    finally:
        project.kill()


def test_a_gate_user_beside_a_broker_user_pushes_or_says_once_why_it_cannot(acl_redis, workdir, project_template):
    lines = acl_lines(GATE_BESIDE_BROKER)
    server = acl_redis(lines)
    settings = {
        "KEYED_QUEUE_LEASE_SECONDS": LEASE_SECONDS,
        "KEYED_QUEUE_LOCAL_HANDOFF_SECONDS": 0,  # each finish pushes the next grant: none is kept to run here
        "KEYED_QUEUE_REDIS_URL": user_url(server, "gate", password(lines, "gate")) + "/0",
    }
    project = UserProject(workdir / "mysite", user_url(server, "broker", password(lines, "broker")), settings)
    project.build(project_template)
    try:
        project.worker("a", concurrency=2)
        run_keyed_tasks(project, "pushed")
        inspect_ping(project)
        assert refusals(server) == [], "the docs' rules let each user do all it does"
        log = worker_log(project)
        assert "as another Redis user ('gate', the broker's 'broker')" in log
        assert PUSHES not in log, "with two users the worker says only what it knows"
        assert REFUSED not in log

        with admin_client(server) as admin:  # the gate user as it would be without the push's rules
            admin.execute_command("ACL", "SETUSER", "gate", "resetkeys", "~keyed_queue:*")
            admin.acl_log_reset()
        run_keyed_tasks(project, "refused")
        refused = refusals(server)
        assert refused, "the gate's pushes were tried, and refused"
        assert {(r["username"], r["context"], r["object"]) for r in refused} <= {
            ("gate", "lua", "_kombu.binding.celery"),
            ("gate", "lua", "celery"),
        }
        warnings = [line for line in worker_log(project).splitlines() if REFUSED in line]
        assert warnings, "a refused push is told"
        by_process = Counter(re.search(r"WARNING/([\w-]+)\]", line)[1] for line in warnings)
        assert max(by_process.values()) == 1, f"once per process: {warnings}"
        assert "LPUSH 'celery'" in warnings[0] and "ACL SETUSER gate %W~celery* %R~_kombu.binding.*" in warnings[0]
    finally:
        project.kill()
