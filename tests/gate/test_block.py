"""``on_failure="block"`` in the gate: a ticket that failed for good keeps its slot, and its key grants
nothing until ``unblock`` runs it again first or withdraws it."""

import json

import pytest

from django_keyed_queue.gate import Cancel, Code, Finish, Lease, RecoveryAction, Start, Submission
from django_keyed_queue.gate.keys import BLOCKED_KEYS
from tests.gate_redis import holder
from tests.waiting import wait_until


def running(gate, key, *, block=True, max_lost=0, limit=1):
    """A new ticket of ``key``, granted (if the key is free) and started."""
    sub = gate.submit(Submission(key, f"msg-{key}".encode(), limit=limit))
    started = gate.start(Start(key, sub.ticket, 1, max_lost=max_lost, block=block))
    assert started.ok
    return sub.ticket, started.token


def blocked(gate, key="k", *, limit=1):
    """Key ``key`` blocked by its first ticket, with its second one waiting behind it."""
    ticket, token = running(gate, key, limit=limit)
    assert gate.finish(Finish(key, ticket, token, limit=limit, block=True)).code is Code.BLOCKED
    return ticket, token


def test_a_failure_that_blocks_keeps_the_slot_and_the_key_grants_nothing(gate, gate_redis):
    ticket, token = blocked(gate)
    later = gate.submit(Submission("k", b"msg-2"))

    assert not later.granted, "a submission to a blocked key waits"
    snapshot = gate.inspect("k")
    assert (snapshot.blocked, snapshot.waiting, holder(gate, "k", ticket).state) == (ticket, [later.ticket], "blocked")
    assert gate.blocked_keys() == ["k"] and gate_redis.sismember(BLOCKED_KEYS, "k")
    assert holder(gate, "k", ticket).blocks_on_failure, "as its start said"
    assert not gate.holds(Lease("k", ticket, token)), "the failed run holds no lease"
    assert gate.start(Start("k", ticket, 1)).code is Code.NOT_GRANTED, "its message may not start it again"
    assert gate.cancel(Cancel("k", ticket)).code is Code.BLOCKED, "a plain cancel leaves it"
    assert gate.resume("k") is None, "resuming it (it is not paused) grants nothing either"
    assert gate.reap()[1] == [] and gate.inspect("k").blocked == ticket, "the reaper leaves it"
    assert gate.release("k", ticket) == [], "so does a release"


def test_a_failure_that_does_not_block_frees_the_slot(gate):
    ticket, token = running(gate, "k", block=True)
    later = gate.submit(Submission("k", b"msg-2"))
    finished = gate.finish(Finish("k", ticket, token))
    assert finished.ok and [g.ticket for g in finished.granted] == [later.ticket]
    assert gate.inspect("k").blocked is None and gate.blocked_keys() == []


def test_retried_it_runs_again_first_with_its_next_dispatch(gate):
    ticket, _ = blocked(gate)
    later = gate.submit(Submission("k", b"msg-2"))

    [again] = gate.unblock("k", ticket, retry=True).granted
    assert (again.ticket, again.dispatch, again.message) == (ticket, 2, b"msg-k")
    assert gate.inspect("k").blocked is None and gate.blocked_keys() == []
    assert gate.start(Start("k", ticket, 1)).code is Code.STALE_DISPATCH
    restarted = gate.start(Start("k", ticket, 2, block=True))
    assert restarted.ok and restarted.attempts == 2
    assert [g.ticket for g in gate.finish(Finish("k", ticket, restarted.token)).granted] == [later.ticket]


def test_cancelled_its_key_moves_on(gate):
    ticket, _ = blocked(gate)
    later = gate.submit(Submission("k", b"msg-2"))

    assert [g.ticket for g in gate.unblock("k", ticket, retry=False).granted] == [later.ticket]
    assert ticket not in gate.inspect("k").holders and gate.blocked_keys() == []
    assert gate.unblock("k", ticket, retry=True).code is Code.NOT_GRANTED, "only the blocking ticket is acted on"


def test_a_key_with_free_slots_grants_nothing_while_blocked(gate):
    ticket, _ = blocked(gate, limit=2)
    assert not gate.submit(Submission("k", b"msg-2", limit=2)).granted


def test_a_lost_worker_past_its_recoveries_blocks_the_key(make_gate):
    quick = make_gate(lease_seconds=0.2)
    ticket, token = running(quick, "k", max_lost=0)
    later = quick.submit(Submission("k", b"msg-2"))

    [recovery] = wait_until(lambda: quick.reap()[1], timeout=5, message="the reaper to act")
    assert (recovery.action, recovery.ticket) == (RecoveryAction.BLOCK, ticket)
    assert quick.inspect("k").blocked == ticket and quick.blocked_keys() == ["k"]
    assert quick.inspect("k").waiting == [later.ticket]


def test_without_the_policy_a_lost_worker_past_its_recoveries_fails_and_frees_the_slot(make_gate):
    quick = make_gate(lease_seconds=0.2)
    ticket, _ = running(quick, "k", block=False, max_lost=0)
    later = quick.submit(Submission("k", b"msg-2"))

    found = wait_until(lambda: quick.reap()[1], timeout=5, message="the reaper to act")
    assert [(r.action, r.ticket) for r in found] == [
        (RecoveryAction.FAIL, ticket),
        (RecoveryAction.GRANT, later.ticket),
    ]


def test_a_listed_key_no_longer_blocked_is_taken_off_the_list(gate, gate_redis):
    gate_redis.sadd(BLOCKED_KEYS, "was-blocked")
    assert gate.blocked_keys() == []
    assert not gate_redis.exists(BLOCKED_KEYS)


@pytest.mark.parametrize("raw", [b"r|1|5|100|1|0|3", b"r|1|5|100|1|0|3|0"])
def test_a_holder_written_before_the_policy_existed_reads_as_not_blocking(gate, gate_redis, raw):
    from django_keyed_queue.gate.keys import KeyNames

    gate_redis.hset(KeyNames("old").holders, 1, raw)
    assert holder(gate, "old", 1).blocks_on_failure is False
    assert gate.renew([Lease("old", 1, 5)]) == {Lease("old", 1, 5): True}


def test_a_run_killed_on_purpose_blocks_the_key_once_it_ended(gate):
    ticket, token = running(gate, "k", max_lost=3)
    assert gate.stop("k", ticket, 1, by="", how="hard time limit exceeded")  # its hard time limit killed it

    [recovery] = gate.release("k", ticket, dispatch=1)  # its worker saw its process end
    assert (recovery.action, gate.inspect("k").blocked) == (RecoveryAction.BLOCK, ticket), "no recovery, a block"


def test_a_granted_ticket_whose_task_failed_unstarted_blocks_its_key_if_its_message_says_so(gate):
    blocking = json.dumps({"task": "t", "id": "a", "on_failure": "block"}).encode()
    first = gate.submit(Submission("k", blocking, task_id="a"))
    second = gate.submit(Submission("k", b"m2", task_id="b"))
    other = gate.submit(Submission("j", json.dumps({"task": "t", "id": "c"}).encode(), task_id="c"))
    assert gate.cancel(Cancel("k", first.ticket, dispatch=1, task_id="a", failed_for_good=True)).code is Code.BLOCKED
    state = gate.inspect("k")
    assert (state.blocked, list(state.holders), state.waiting) == (first.ticket, [first.ticket], [second.ticket])
    assert "k" in gate.blocked_keys()
    done = gate.cancel(Cancel("j", other.ticket, dispatch=1, task_id="c", failed_for_good=True))
    assert done.code is Code.OK and not gate.inspect("j").holders, "a task that does not block is withdrawn"
