"""Pools at the gate: a limit and a rate shared by every key, asked at a ticket's start.

A worker asks the pool before its key (``pool_acquire``, then ``start``); a ticket the pool has no
slot for waits for its pool (``pool_wait``) holding no message, and is published again when a slot
goes back (``pool_release``, then its key's ``pool_granted``).
"""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.crc import key_slot

from django_keyed_queue.gate import Cancel, Code, Finish, Gate, Lease, Pool, RecoveryAction, Start, Submission
from django_keyed_queue.gate.keys import POOLS, KeyNames, PoolNames, member_ticket, pool_member

PAIR = Pool("payments", limit=2, interval_ms=0)


def _granted(gate: Gate, key: str) -> tuple[int, int]:
    submitted = gate.submit(Submission(key, b"m"))
    assert submitted is not None and submitted.granted
    return submitted.ticket, 1


def _run(gate: Gate, pool: Pool, key: str, ticket: int, dispatch: int):
    """What a worker does with a delivered message: the pool first, then the key."""
    acquired = gate.pool_acquire(pool, key, ticket)
    if acquired.code is Code.PARKED:
        assert gate.pool_wait(key, ticket, dispatch, pool=pool.name)
        return acquired, None
    return acquired, gate.start(Start(key, ticket, dispatch))


def test_at_most_the_limit_runs_whatever_the_keys(gate):
    started = {}
    for key in ("a", "b"):
        ticket, dispatch = _granted(gate, key)
        acquired, start = _run(gate, PAIR, key, ticket, dispatch)
        assert acquired.ok and start.ok
        started[key] = (ticket, start.token)

    ticket, dispatch = _granted(gate, "c")
    acquired, start = _run(gate, PAIR, "c", ticket, dispatch)

    assert acquired.code is Code.PARKED and start is None
    assert gate.inspect("c").holders[ticket].state == "waiting_for_pool"
    assert gate.start(Start("c", ticket, dispatch)).code is Code.NOT_GRANTED, (
        "a waiting ticket's message cannot start it"
    )

    gate.finish(Finish("a", *started["a"]))
    (grant,) = gate.pool_release(PAIR.name, [("a", started["a"][0])])
    assert (grant.key, grant.ticket, grant.dispatch) == ("c", ticket, dispatch + 1)
    assert gate.start(Start("c", ticket, dispatch)).code is Code.STALE_DISPATCH, "the refused message stays refused"
    acquired, start = _run(gate, PAIR, "c", ticket, grant.dispatch)
    assert acquired.ok and start.ok


def test_the_pool_serves_waiting_tickets_first_come_whatever_their_key(gate):
    one = Pool("one", limit=1, interval_ms=0)
    first, dispatch = _granted(gate, "first")
    _, start = _run(gate, one, "first", first, dispatch)
    arrivals = ["d", "b", "e", "c"]
    for key in arrivals:
        assert _run(gate, one, key, *_granted(gate, key))[0].code is Code.PARKED

    served = []
    key, ticket, token = "first", first, start.token
    for _ in arrivals:
        gate.finish(Finish(key, ticket, token))
        (grant,) = gate.pool_release(one.name, [(key, ticket)])
        served.append(grant.key)
        acquired, start = _run(gate, one, grant.key, grant.ticket, grant.dispatch)
        assert acquired.ok and start.ok
        key, ticket, token = grant.key, grant.ticket, start.token

    assert served == arrivals


def test_a_slot_whose_deadline_passed_goes_to_the_next(gate, gate_redis):
    one = Pool("one", limit=1, interval_ms=0)
    held, dispatch = _granted(gate, "a")
    assert _run(gate, one, "a", held, dispatch)[1].ok
    waiting, dispatch = _granted(gate, "b")
    assert _run(gate, one, "b", waiting, dispatch)[0].code is Code.PARKED

    gate_redis.zadd(PoolNames("one").running, {pool_member("a", held): 1})  # its worker died long ago

    (recovery,) = gate.reap_pools()
    assert (recovery.action, recovery.key, recovery.ticket, recovery.dispatch) == (RecoveryAction.GRANT, "b", 1, 2)


def test_a_running_ticket_s_slot_outlasts_its_lease(make_gate, gate_redis):
    gate = make_gate(lease_seconds=0.3)
    one = Pool("one", limit=1, interval_ms=0)
    ticket, dispatch = _granted(gate, "a")
    start = _run(gate, one, "a", ticket, dispatch)[1]
    lease_end = gate.inspect("a").holders[ticket].deadline_in
    slot_end = gate_redis.zscore(PoolNames("one").running, pool_member("a", ticket)) / 1000 - time.time()
    assert slot_end > lease_end + 0.2, "the slot is held past the lease, by the margin"

    lease, stranger = Lease("a", ticket, start.token), Lease("a", 99, 1)
    time.sleep(0.2)
    assert gate.pool_renew("one", [lease, stranger]) == {lease: True, stranger: False}, "no slot, no renew"
    renewed_end = gate_redis.zscore(PoolNames("one").running, pool_member("a", ticket)) / 1000 - time.time()
    assert renewed_end > slot_end - 0.2 + 0.1, "a renew holds it a lease and the margin from now"


def test_the_reaper_asks_the_pool_again_for_a_ticket_that_still_waits(gate, gate_redis):
    one = Pool("one", limit=1, interval_ms=0)
    held, dispatch = _granted(gate, "a")
    start = _run(gate, one, "a", held, dispatch)[1]
    waiting, dispatch = _granted(gate, "b")
    assert _run(gate, one, "b", waiting, dispatch)[0].code is Code.PARKED

    (still,) = gate.release("b", waiting)
    assert still.action is RecoveryAction.POOL and still.message == b"one", "no slot yet: it waits on"

    # The run ends and its slot goes back, but the process died before its key heard of it.
    gate.finish(Finish("a", held, start.token))
    gate_redis.zrem(PoolNames("one").running, pool_member("a", held))
    gate_redis.zadd(PoolNames("one").running, {pool_member("b", waiting): 10**13})

    (granted,) = gate.release("b", waiting)
    assert (granted.action, granted.ticket, granted.dispatch) == (RecoveryAction.GRANT, waiting, dispatch + 1)
    assert gate.start(Start("b", waiting, granted.dispatch)).ok


def test_a_slot_given_to_a_ticket_that_ended_goes_to_the_next(gate):
    one = Pool("one", limit=1, interval_ms=0)
    held, dispatch = _granted(gate, "a")
    start = _run(gate, one, "a", held, dispatch)[1]
    for key in ("b", "c"):
        assert _run(gate, one, key, *_granted(gate, key))[0].code is Code.PARKED
    assert gate.cancel(Cancel("b", 1)).ok  # it waited for its pool; its member is still in the line

    gate.finish(Finish("a", held, start.token))
    (grant,) = gate.pool_release("one", [("a", held)])

    assert (grant.key, grant.ticket) == ("c", 1)


def test_the_rate_spaces_starts_and_hands_out_start_times_in_turn(gate):
    paced = Pool("paced", limit=0, interval_ms=300)
    tickets = {key: _granted(gate, key)[0] for key in ("a", "b", "c")}

    first = gate.pool_acquire(paced, "a", tickets["a"])
    second = gate.pool_acquire(paced, "b", tickets["b"])
    third = gate.pool_acquire(paced, "c", tickets["c"])

    assert first.ok
    assert second.code is Code.TOO_EARLY and 0.2 < second.wait_seconds <= 0.3
    assert third.code is Code.TOO_EARLY and 0.5 < third.wait_seconds <= 0.6, "each is given its own time"
    assert gate.pool_acquire(paced, "c", tickets["c"]).code is Code.TOO_EARLY, "not before its time"
    time.sleep(second.wait_seconds)
    assert gate.pool_acquire(paced, "b", tickets["b"]).ok, "its own time: it starts"


def test_a_pool_s_limit_and_rate_are_kept_for_the_reaper(gate, gate_redis):
    gate.pool_acquire(Pool("kept", limit=3, interval_ms=50), "a", _granted(gate, "a")[0])
    assert gate_redis.hmget(PoolNames("kept").meta, "limit", "interval") == [b"3", b"50"]
    assert gate_redis.sismember(POOLS, "kept")

    gate.pool_acquire(Pool("kept"), "b", _granted(gate, "b")[0], starting=False)

    assert gate_redis.hmget(PoolNames("kept").meta, "limit", "interval") == [b"3", b"50"], "an ask knows no task"


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"name": ""}, "must not be empty"),
        ({"name": "p", "limit": -1, "interval_ms": 0}, "must not be negative"),
        ({"name": "p", "limit": 1}, "give both"),
    ],
)
def test_a_bad_pool_is_refused_naming_what_is_wrong(kwargs, error):
    with pytest.raises(ValueError, match=error):
        Pool(**kwargs)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pool=st.text(min_size=1, max_size=300), key=st.text(min_size=1, max_size=200))
def test_any_pool_name_and_key_keep_their_slots_apart(gate, gate_redis, pool, key):
    """NUL, braces, bars, unicode and long names: a member names its key and ticket back, and each pool's
    keys share one slot (a Redis Cluster runs each script on one)."""
    names = PoolNames(pool)
    assert len({key_slot(n.encode()) for n in names.all()}) == 1
    ticket = gate.submit(Submission(key, b"m")).ticket
    acquired = gate.pool_acquire(Pool(pool, limit=1, interval_ms=0), key, ticket)
    assert acquired.ok
    (member,) = gate_redis.zrange(names.running, 0, -1)
    assert member_ticket(member.decode()) == (key, ticket)
    assert gate.pool_release(pool, [(key, ticket)]) == []
    assert gate_redis.zcard(names.running) == 0
    gate.cancel(Cancel(key, ticket))
    gate_redis.delete(*names.all(), *KeyNames(key).all())


# --- start and finish with their pool: one call on one server, calls apart on a Redis Cluster ---------


def test_start_asks_the_pool_and_finish_gives_its_slot_to_the_next(gate):
    one = Pool("one", limit=1, interval_ms=0)
    a, _ = _granted(gate, "a")
    b, _ = _granted(gate, "b")
    running = gate.start(Start("a", a, 1, pool=one))
    waiting = gate.start(Start("b", b, 1, pool=one))

    assert running.ok and waiting.code is Code.PARKED
    assert gate.inspect("b").holders[b].state == "waiting_for_pool"
    assert gate.inspect_pool("one").waiting_first == [("b", b)]

    finished = gate.finish(Finish("a", a, running.token, pool="one"))

    assert [(g.key, g.ticket, g.dispatch) for g in finished.granted] == [("b", b, 2)]
    assert gate.start(Start("b", b, 2, pool=one)).ok
    assert [(k, t) for k, t, _ in gate.inspect_pool("one").running] == [("b", b)]


def test_a_start_the_key_refuses_takes_no_pool_slot(gate, gate_redis):
    one = Pool("one", limit=1, interval_ms=0)
    a, _ = _granted(gate, "a")
    started = gate.start(Start("a", a, 1, pool=one))
    gate.finish(Finish("a", a, started.token, pool="one"))

    late_copy = gate.start(Start("a", a, 1, pool=one))

    assert late_copy.code is Code.NOT_GRANTED
    assert gate_redis.zcard(PoolNames("one").running) == 0, "the slot is free for the next"


def test_a_blocked_run_keeps_its_key_and_gives_its_pool_slot_back(gate):
    one = Pool("one", limit=1, interval_ms=0)
    a, _ = _granted(gate, "a")
    b, _ = _granted(gate, "b")
    started = gate.start(Start("a", a, 1, pool=one, block=True))
    assert gate.start(Start("b", b, 1, pool=one)).code is Code.PARKED

    finished = gate.finish(Finish("a", a, started.token, block=True, pool="one"))

    assert finished.code is Code.BLOCKED
    assert [(g.key, g.ticket) for g in finished.granted] == [("b", b)]


def test_the_pool_s_rate_at_start_says_when_with_the_stored_message(gate):
    paced = Pool("paced", limit=0, interval_ms=400)
    a, _ = _granted(gate, "a")
    b = gate.submit(Submission("b", b"the message of b")).ticket

    assert gate.start(Start("a", a, 1, pool=paced)).ok
    early = gate.start(Start("b", b, 1, pool=paced))

    assert early.code is Code.TOO_EARLY and 0.3 < early.wait_seconds <= 0.4
    assert early.message == b"the message of b"
    assert gate.inspect("b").holders[b].deadline_in > early.wait_seconds, "the reaper sends no copy sooner"


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(keys=st.lists(st.text(min_size=1, max_size=60), min_size=2, max_size=2, unique=True))
def test_a_freed_slot_reaches_a_key_of_any_name(gate, gate_redis, keys):
    """Braces, percents, bars, NUL and unicode: the script that frees a slot names the next ticket's key as
    the gate does, and tells that key (on one server, in the same call)."""
    one = Pool("one", limit=1, interval_ms=0)
    first, second = keys
    a, b = gate.submit(Submission(first, b"m")).ticket, gate.submit(Submission(second, b"m")).ticket
    started = gate.start(Start(first, a, 1, pool=one))
    assert gate.start(Start(second, b, 1, pool=one)).code is Code.PARKED

    (grant,) = gate.finish(Finish(first, a, started.token, pool="one")).granted

    assert (grant.key, grant.ticket, grant.dispatch) == (second, b, 2)
    assert gate.inspect(second).holders[b].state == "granted"
    gate.cancel(Cancel(second, b))
    gate_redis.delete(*PoolNames("one").all(), *KeyNames(first).all(), *KeyNames(second).all())


def test_a_finish_that_starts_its_kept_grant_asks_its_pool_for_it(gate):
    """A worker's local handoff: the finish starts the key's next ticket for its caller, with a slot of the
    pool asked there too, after the pool's line was served; with none left, the kept grant is not started."""
    from django_keyed_queue.gate import KeptStart

    one = Pool("one", limit=1, interval_ms=0)
    message = json.dumps({"task": "t", "id": "x"}).encode()
    first, second = gate.submit(Submission("a", message)).ticket, gate.submit(Submission("a", message)).ticket
    started = gate.start(Start("a", first, 1, pool=one))
    kept = KeptStart("t", max_lost=1)

    finished = gate.finish(Finish("a", first, started.token, pool="one", keep_first_seconds=5, start_kept=kept))

    (grant,) = finished.granted
    if gate.pools_apart:  # a Redis Cluster: the finish cannot ask the pool, so it starts nothing
        assert grant.ticket == second and grant.token == 0
        return
    assert grant.ticket == second and grant.token > 0, "started with the slot the finish gave back"
    assert [(k, t) for k, t, _ in gate.inspect_pool("one").running] == [("a", second)]

    b = gate.submit(Submission("b", b"m")).ticket
    assert gate.start(Start("b", b, 1, pool=one)).code is Code.PARKED
    third = gate.submit(Submission("a", message)).ticket
    finished = gate.finish(Finish("a", second, grant.token, pool="one", keep_first_seconds=5, start_kept=kept))

    assert [(g.key, g.ticket, g.token) for g in finished.granted] == [("a", third, 0), ("b", b, 0)], (
        "the line first: b takes the slot, and a's kept grant is not started"
    )


def test_a_ticket_asking_again_before_its_start_time_keeps_it(gate):
    paced = Pool("paced", limit=0, interval_ms=300)
    a, b, c = (_granted(gate, key)[0] for key in ("a", "b", "c"))
    assert gate.pool_acquire(paced, "a", a).ok
    first = gate.pool_acquire(paced, "b", b)

    again = gate.pool_acquire(paced, "b", b)  # a copy of its message, or a second ask
    third = gate.pool_acquire(paced, "c", c)

    assert again.code is Code.TOO_EARLY and abs(again.wait_seconds - first.wait_seconds) < 0.05
    assert 0.5 < third.wait_seconds <= 0.6, "no second start time taken: c's is the next"


def test_a_ticket_back_at_its_time_after_a_late_start_keeps_its_place_in_line(gate):
    """The start before it ran late: it waits out only the interval since that start, not every time handed out."""
    paced = Pool("paced", limit=0, interval_ms=300)
    a, b, c, d = (_granted(gate, key)[0] for key in "abcd")
    assert gate.pool_acquire(paced, "a", a).ok
    b_wait = gate.pool_acquire(paced, "b", b).wait_seconds
    c_wait = gate.pool_acquire(paced, "c", c).wait_seconds
    assert gate.pool_acquire(paced, "d", d).code is Code.TOO_EARLY  # the last start time handed out: 900 ms on

    time.sleep(b_wait + 0.1)
    assert gate.pool_acquire(paced, "b", b).ok, "b starts 100 ms after its time"
    time.sleep(c_wait - b_wait - 0.1)  # c's own time, 200 ms after b's start
    back = gate.pool_acquire(paced, "c", c)

    assert back.ok or (back.code is Code.TOO_EARLY and back.wait_seconds <= 0.15), (
        f"c waits {back.wait_seconds:.3f} s: sent behind d's time, not 300 ms after b's start"
    )
    time.sleep(back.wait_seconds)
    assert back.ok or gate.pool_acquire(paced, "c", c).ok


def test_a_pooled_task_with_room_makes_no_call_more_than_a_keyed_one(gate, monkeypatch):
    """On one server its start asks its pool and its finish gives the slot back, in their own calls."""
    if gate.pools_apart:
        pytest.skip("on a Redis Cluster the pool is asked in calls of its own: three more")
    sent = []
    round_trip = gate._transport.round_trip
    monkeypatch.setattr(
        gate._transport, "round_trip", lambda commands: sent.append(len(commands)) or round_trip(commands)
    )
    roomy = Pool("roomy", limit=100, interval_ms=0)
    trips = {}
    for key, pool in (("warm", None), ("warm-pooled", roomy), ("keyed", None), ("pooled", roomy)):  # scripts loaded
        sent.clear()
        ticket = gate.submit(Submission(key, b"m")).ticket
        started = gate.start(Start(key, ticket, 1, pool=pool))
        gate.finish(Finish(key, ticket, started.token, pool=pool.name if pool else None))
        trips[key] = (len(sent), sum(sent))
    assert trips["pooled"] == trips["keyed"], "as many round trips, as many commands"
