"""Operator commands: pause, resume and status of a key."""

import io
import json
import logging
import sys
import time

import pytest
from django.core.management import CommandError, call_command

from django_keyed_queue.gate import Finish, Start
from django_keyed_queue.messaging.message import HEADER
from django_keyed_queue.process.state import get_gate
from django_keyed_queue.records.models import KeyedTask
from django_keyed_queue.testing import write_submission_rows
from testproject.demo.tasks import step
from tests.django.queues import QUEUE

pytestmark = pytest.mark.django_db


def run(*args) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def published_tickets(broker) -> list[int]:
    return [json.loads(raw)["headers"][HEADER]["ticket"] for raw in broker.lrange(QUEUE, 0, -1)]


def test_a_paused_key_dispatches_nothing_new_and_resume_dispatches_in_order(gate_redis, broker):
    assert "paused 'k'" in run("keyed_queue_pause", "k")
    results = [step.apply_async(("k", n), queue=QUEUE) for n in range(3)]
    assert broker.llen(QUEUE) == 0, "a paused key grants nothing, even with a free slot"
    write_submission_rows()
    assert {r.status for r in KeyedTask.objects.all()} == {"waiting"}
    status = run("keyed_queue_status", "--key", "k")
    assert "key 'k': paused, last ticket 3" in status and "waiting tickets: [1, 2, 3]" in status
    assert "active tasks: waiting 3" in status

    assert "resumed 'k': 1 dispatched" in run("keyed_queue_resume", "k")
    assert published_tickets(broker) == [1]
    gate = get_gate()
    started = gate.start(Start("k", 1, 1))
    gate.pause("k")
    assert gate.finish(Finish("k", 1, started.token)).granted == [], "a running task finishes; nothing follows"
    gate.resume("k")
    assert published_tickets(broker) == [1] and gate.inspect("k").holders.keys() == {2}
    assert len(results) == 3


def test_a_pause_or_a_resume_repeated_says_it_changed_nothing_and_exits_as_the_first(gate_redis, broker):
    """The same request twice gives the same exit status; the second writes nothing and keeps the first's pause."""
    assert run("keyed_queue_resume", "never-paused") == "key 'never-paused' was not paused: nothing changed\n"
    assert gate_redis.dbsize() == 0, "nothing written for a key never paused"
    assert "paused 'k'" in run("keyed_queue_pause", "k")
    first = get_gate().inspect("k")
    time.sleep(0.01)
    assert run("keyed_queue_pause", "k") == "key 'k' was paused already: nothing changed\n"
    again = get_gate().inspect("k")
    assert (again.paused_since, again.paused_by) == (first.paused_since, first.paused_by), "the first pause is kept"
    assert "resumed 'k'" in run("keyed_queue_resume", "k")
    assert run("keyed_queue_resume", "k") == "key 'k' was not paused: nothing changed\n"


def test_a_command_prints_its_result_once_and_the_audit_log_still_gets_it(gate_redis, capsys):
    logger = logging.getLogger("django_keyed_queue")
    console, log_file = logging.StreamHandler(sys.stderr), logging.StreamHandler(io.StringIO())
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(console)
    logger.addHandler(log_file)
    try:
        call_command("keyed_queue_pause", "k")
        call_command("keyed_queue_rebuild")
    finally:
        logger.removeHandler(console)
        logger.removeHandler(log_file)
        logger.setLevel(level)
    out, err = capsys.readouterr()
    assert (
        out
        == "paused 'k'\nrestored 0 tasks over 0 keys; 0 running at the loss marked lost; 0 keys held back by one; "
        "0 tasks the gate still keeps left as they are; 0 tasks without a stored message of their own\n"
        and err == ""
    ), (out, err)
    assert "key 'k' paused by" in log_file.stream.getvalue()
    assert "keyed queue rebuild" in log_file.stream.getvalue()


def test_status_of_a_deep_key_lists_its_oldest_waiting_tickets_and_counts_the_rest(gate_redis, broker):
    run("keyed_queue_pause", "k")
    for n in range(25):
        step.apply_async(("k", n), queue=QUEUE)
    status = run("keyed_queue_status", "--key", "k")
    assert f"waiting tickets: {list(range(1, 21))} and 5 more" in status


def test_bad_keys_fail_with_a_clear_error():
    with pytest.raises(CommandError, match="a key is 1 to 200 characters"):
        call_command("keyed_queue_pause", "")
    with pytest.raises(CommandError, match="a key is 1 to 200 characters"):
        call_command("keyed_queue_resume", "x" * 201)


@pytest.mark.parametrize(
    "command",
    [["keyed_queue_status"], ["keyed_queue_pause", "k"], ["keyed_queue_resume", "k"], ["keyed_queue_reap"]],
)
def test_commands_report_an_unreachable_redis(settings, command):
    settings.KEYED_QUEUE_REDIS_URL = "redis://127.0.0.1:1/0"
    with pytest.raises(CommandError, match="the keyed queue's Redis is unreachable"):
        call_command(*command, stdout=io.StringIO())


@pytest.mark.parametrize(
    "command, error",
    [
        (("keyed_queue_status", "--key", "unknown"), "no keyed task has the key 'unknown'"),
        (("keyed_queue_status", "--key", ""), "a key is 1 to 200 characters"),
        (("keyed_queue_pause", "k" * 201), "a key is 1 to 200 characters"),
    ],
)
def test_an_unknown_or_bad_key_is_an_error_and_writes_nothing(gate_redis, command, error):
    with pytest.raises(CommandError, match=error):
        run(*command)
    assert gate_redis.dbsize() == 0
