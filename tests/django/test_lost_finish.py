"""A worker's finish whose reply was lost (a restart or a failover in between): what it granted goes out at once."""

import json

import pytest

from django_keyed_queue.gate import Finish, Lease, Start, Submission
from django_keyed_queue.messaging.message import HEADER
from django_keyed_queue.process.state import current
from django_keyed_queue.testing import write_submission_rows
from django_keyed_queue.worker.run import Run
from testproject.demo.tasks import step
from tests.django.queues import QUEUE

from .test_submission import lose_replies

pytestmark = pytest.mark.django_db


def test_a_finish_applied_before_its_reply_was_lost_publishes_the_next_task_at_once(gate_redis, broker, monkeypatch):
    first = step.apply_async(("a", 0), queue=QUEUE)
    second = step.apply_async(("a", 1), queue=QUEUE)
    write_submission_rows()
    gate = current().gate
    started = gate.start(Start("a", 1, 1, task_id=first.id))
    broker.delete(QUEUE)  # the first task's message, as a worker would have taken it
    warm = gate.submit(Submission("warm", b"m"))
    # The finish script loaded, so that the call whose reply is lost runs.
    gate.finish(Finish("warm", warm.ticket, gate.start(Start("warm", warm.ticket, 1)).token))

    lost = lose_replies(monkeypatch, 1)
    step.push_request(id=first.id)
    try:
        assert Run(step, Lease("a", 1, started.token), attempts=1).succeed()
    finally:
        step.pop_request()

    assert lost == ["EVALSHA"], "the finish ran in Redis and its reply was lost"
    [raw] = broker.lrange(QUEUE, 0, -1)
    message = json.loads(raw)
    assert message["headers"]["id"] == second.id
    assert message["headers"][HEADER]["ticket"] == 2, "published at once, not after the dispatch timeout"
    assert gate.start(Start("a", 2, message["headers"][HEADER]["dispatch"], task_id=second.id)).ok
    current().recorder.flush()  # the run's records, in this test's database (its thread would write them later)
