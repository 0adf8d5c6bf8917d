"""Run now: a granted ticket that waits for its key's rate (or its message's eta) goes out again with its
next dispatch and starts at once, once; a faster rate sends again a grant told to wait for the slower one."""

import time

from django_keyed_queue.gate import Code, Finish, Start, Submission
from django_keyed_queue.gate.keys import KeyNames

MINUTE_MS = 60_000


def waiting_for_rate(gate, key: str = "k") -> int:
    """A paced key (a start a minute at most) whose second ticket is granted and told to wait: its ticket."""
    first = gate.submit(Submission(key, b'{"id": "t1"}', task_id="t1"))
    second = gate.submit(Submission(key, b'{"id": "t2"}', task_id="t2"))
    started = gate.start(Start(key, first.ticket, 1, interval_ms=MINUTE_MS))
    assert started.ok
    assert [g.ticket for g in gate.finish(Finish(key, first.ticket, started.token)).granted] == [second.ticket]
    early = gate.start(Start(key, second.ticket, 1, interval_ms=MINUTE_MS))
    assert early.code is Code.TOO_EARLY and early.wait_seconds > 50
    return second.ticket


def test_run_now_starts_a_grant_waiting_for_its_rate_once(gate):
    ticket = waiting_for_rate(gate)

    grant = gate.run_now("k", ticket, 1)

    assert grant is not None and (grant.ticket, grant.dispatch, grant.message) == (ticket, 2, b'{"id": "t2"}')
    assert gate.start(Start("k", ticket, 1, interval_ms=MINUTE_MS)).code is Code.STALE_DISPATCH, (
        "the waiting copy is dropped"
    )
    assert gate.run_now("k", ticket, 1) is None, "a second Run now of the dispatch seen does nothing"
    assert gate.wait_to_start("k", ticket, 2, interval_ms=MINUTE_MS)[0] == 0, "a worker hands it to a process at once"
    assert gate.start(Start("k", ticket, 2, interval_ms=MINUTE_MS)).ok, "it starts now, whatever the rate"
    assert gate.run_now("k", ticket, 2) is None, "a running ticket is not run now"


def test_run_now_of_a_ticket_that_is_not_granted_changes_nothing(gate, gate_redis):
    first = gate.submit(Submission("k", b'{"id": "t1"}', task_id="t1", start=True))
    parked = gate.submit(Submission("k", b'{"id": "t2"}', task_id="t2"))
    holders = {name: gate_redis.hgetall(name) for name in [KeyNames("k").holders, KeyNames("k").meta]}
    assert gate.run_now("k", first.ticket, 1) is None, "running"
    assert gate.run_now("k", parked.ticket, 1) is None, "waiting for its turn, not for a time"
    assert gate.run_now("k", 99, 1) is None
    assert {name: gate_redis.hgetall(name) for name in holders} == holders
    assert gate.inspect("k").waiting == [parked.ticket]


def test_a_faster_rate_sends_again_a_grant_told_to_wait_for_the_slower_one(gate):
    ticket = waiting_for_rate(gate)
    assert gate.set_overrides("k", interval_ms=2 * MINUTE_MS).granted == [], "a slower rate sends nothing again"

    again = gate.set_overrides("k", interval_ms=10).granted

    assert [(g.ticket, g.dispatch) for g in again] == [(ticket, 2)]
    time.sleep(0.02)
    assert gate.start(Start("k", ticket, 2, interval_ms=MINUTE_MS)).ok, "its start asks the new rate"
