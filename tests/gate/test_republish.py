"""Grants stranded by a lost broker connection, and grants the broker refused, go out again early."""

import time

from django_keyed_queue.gate import Code, RecoveryAction, Start, Submission
from tests.gate_redis import holder


def granted(gate, key: str) -> int:
    submitted = gate.submit(Submission(key, f"msg-{key}".encode()))
    assert submitted.granted
    return submitted.ticket


def test_grants_made_before_the_loss_and_not_started_are_published_again(gate):
    stranded = granted(gate, "stranded")
    running = granted(gate, "running")
    assert gate.start(Start("running", running, 1)).ok
    behind = granted(gate, "busy")
    gate.submit(Submission("busy", b"parked"))
    time.sleep(0.3)
    after_the_loss = granted(gate, "late")

    found = gate.republish_unstarted(granted_seconds_ago=0.2)
    assert sorted((r.key, r.action, r.ticket, r.dispatch, r.message) for r in found) == [
        ("busy", RecoveryAction.REPUBLISH, behind, 1, b"msg-busy"),
        ("stranded", RecoveryAction.REPUBLISH, stranded, 1, b"msg-stranded"),
    ], "a running ticket, a parked one and one granted after the loss are left alone"
    assert holder(gate, "late", after_the_loss).state == "granted"

    # Either copy may start the ticket; the other is then dropped.
    assert gate.start(Start("stranded", stranded, 1)).ok
    assert gate.start(Start("stranded", stranded, 1)).code is Code.ALREADY_STARTED


def test_a_second_worker_that_lost_its_connection_too_publishes_nothing_more(gate):
    granted(gate, "k")
    time.sleep(0.3)
    assert [r.action for r in gate.republish_unstarted(granted_seconds_ago=0.2)] == [RecoveryAction.REPUBLISH]
    assert gate.republish_unstarted(granted_seconds_ago=0.2) == []


def test_a_refused_publish_is_due_for_the_reaper_after_the_delay(gate):
    ticket = granted(gate, "k")
    assert gate.republish_soon("k", ticket, 1, delay_seconds=0.2)
    assert gate.reap()[1] == []
    assert 0 < holder(gate, "k", ticket).deadline_in <= 0.2
    time.sleep(0.3)
    [recovery] = gate.reap()[1]
    assert (recovery.action, recovery.ticket, recovery.dispatch) == (RecoveryAction.REPUBLISH, ticket, 1)
    assert holder(gate, "k", ticket).deadline_in > 50, "then it waits the dispatch timeout again"


def test_only_a_granted_ticket_of_that_dispatch_is_brought_forward(gate):
    ticket = granted(gate, "k")
    assert not gate.republish_soon("k", ticket, 2, delay_seconds=0.1), "another dispatch"
    assert gate.start(Start("k", ticket, 1)).ok
    assert not gate.republish_soon("k", ticket, 1, delay_seconds=0.1), "it started"
    assert not gate.republish_soon("k", ticket + 1, 1, delay_seconds=0.1), "no such ticket"
    assert holder(gate, "k", ticket).deadline_in > 20
