"""override.lua: an operator's limit and rate for one key, over its tasks' own."""

from __future__ import annotations

import threading
import time

import pytest

from django_keyed_queue.gate import UNCHANGED, Code, Finish, KeptStart, Start, Submission
from django_keyed_queue.gate.keys import OVERRIDDEN_KEYS, KeyNames


def fill(gate, key: str, n: int, limit: int = 1) -> list[int]:
    return [gate.submit(Submission(key, f"m{i}".encode(), limit=limit)).ticket for i in range(n)]


def test_a_raised_limit_grants_the_waiting_tickets_at_once_and_another_key_keeps_its_own(gate):
    fill(gate, "k", 4)
    fill(gate, "other", 2)

    granted = gate.set_overrides("k", limit=3).granted

    assert [g.ticket for g in granted] == [2, 3]
    state = gate.inspect("k")
    assert sorted(state.holders) == [1, 2, 3] and state.waiting == [4] and state.limit_override == 3
    assert list(gate.inspect("other").holders) == [1] and gate.inspect("other").limit_override is None


def test_the_override_decides_every_later_grant_and_clearing_it_goes_back_to_the_tasks_own(gate):
    gate.set_overrides("k", limit=2)
    first, second, third = (gate.submit(Submission("k", b"m", limit=1)) for _ in range(3))
    assert (first.granted, second.granted, third.granted) == (True, True, False)

    back = gate.set_overrides("k", limit=None)
    assert back.granted == [] and [t for t, _ in back.withdrawn] == [second.ticket], "its own limit of 1 again"
    s1 = gate.start(Start("k", first.ticket, 1))
    finished = gate.finish(Finish("k", first.ticket, s1.token, limit=1))
    assert [g.ticket for g in finished.granted] == [second.ticket], "then the second, then the third"
    assert gate.inspect("k").limit_override is None


def test_setting_the_same_override_again_changes_nothing(gate):
    fill(gate, "k", 3)
    assert [g.ticket for g in gate.set_overrides("k", limit=2).granted] == [2]
    assert gate.set_overrides("k", limit=2).granted == []
    assert sorted(gate.inspect("k").holders) == [1, 2]


def test_a_lowered_limit_lets_the_running_ones_finish_and_grants_below_it(gate):
    tickets = fill(gate, "k", 3, limit=3)
    runs = [gate.start(Start("k", t, 1)) for t in tickets]
    assert gate.set_overrides("k", limit=1).withdrawn == [], "running tasks are never stopped"
    fill(gate, "k", 1, limit=3)

    assert gate.finish(Finish("k", tickets[0], runs[0].token, limit=3)).granted == []
    assert gate.finish(Finish("k", tickets[1], runs[1].token, limit=3)).granted == []
    assert [g.ticket for g in gate.finish(Finish("k", tickets[2], runs[2].token, limit=3)).granted] == [4]


def test_a_lowered_limit_takes_back_grants_never_started_newest_first_and_they_wait_in_order(gate):
    """5 granted, 1 started; the limit lowered to 1: the 4 not started wait again, first in the queue, and
    a message of theirs that reaches a worker is dropped. A retried holder (started once) keeps its grant."""
    tickets = [
        gate.submit(Submission("k", f'{{"id": "t{i}"}}'.encode(), limit=5, task_id=f"t{i}")).ticket for i in range(6)
    ]
    running = gate.start(Start("k", tickets[0], 1))

    overridden = gate.set_overrides("k", limit=1)

    assert overridden.withdrawn == [(t, f"t{i}") for i, t in enumerate(tickets[1:5], start=1)]
    state = gate.inspect("k")
    assert list(state.holders) == [tickets[0]] and state.waiting == tickets[1:]
    assert gate.start(Start("k", tickets[1], 1)).code is Code.NOT_GRANTED, "its published message starts nothing"
    granted = gate.finish(Finish("k", tickets[0], running.token, limit=5)).granted
    assert [g.ticket for g in granted] == [tickets[1]], "one at a time, in ticket order"
    assert gate.set_overrides("k", limit=1).withdrawn == [], "repeated: nothing more"


def test_an_override_outlives_the_keys_idle_period_and_is_listed_until_cleared(make_gate, gate_redis):
    gate = make_gate(idle_horizon_seconds=1)
    run = gate.submit(Submission("k", b"m", start=True))
    gate.set_overrides("k", limit=2)
    gate.finish(Finish("k", run.ticket, run.token))
    assert gate_redis.pttl(KeyNames("k").meta) == -1, "meta is kept while it holds an operator's word"
    assert gate.overridden_keys() == ["k"]

    gate.set_overrides("k", limit=None)

    assert gate_redis.pttl(KeyNames("k").meta) != -1, "it expires again, as an idle key's counters do"
    assert gate.overridden_keys() == []
    assert not gate_redis.sismember(OVERRIDDEN_KEYS, "k")


def test_an_override_on_a_key_that_never_had_a_task_then_cleared_leaves_nothing(gate, gate_redis):
    gate.set_overrides("fresh", limit=5, interval_ms=100)
    assert gate.inspect("fresh").limit_override == 5
    gate.set_overrides("fresh", limit=None, interval_ms=None)
    assert not gate_redis.exists(KeyNames("fresh").meta)


def test_unchanged_leaves_the_other_override_as_it_is(gate):
    gate.set_overrides("k", limit=3, interval_ms=200)
    gate.set_overrides("k", interval_ms=None)
    state = gate.inspect("k")
    assert (state.limit_override, state.interval_override_ms) == (3, None)
    gate.set_overrides("k", limit=UNCHANGED, interval_ms=50)
    state = gate.inspect("k")
    assert (state.limit_override, state.interval_override_ms) == (3, 50)


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "2"])
def test_a_bad_override_is_refused_and_nothing_is_written(gate, gate_redis, bad):
    with pytest.raises(ValueError, match="an override is an int >= 1 or None"):
        gate.set_overrides("k", limit=bad)
    assert not gate_redis.exists(KeyNames("k").meta) and not gate_redis.sismember(OVERRIDDEN_KEYS, "k")


def test_a_rate_override_paces_starts_of_a_task_that_has_none(gate):
    gate.set_overrides("k", limit=2, interval_ms=300)
    first, second = (gate.submit(Submission("k", b"m", limit=1)) for _ in range(2))

    assert gate.start(Start("k", first.ticket, 1)).ok
    early = gate.start(Start("k", second.ticket, 1))  # the task itself has no rate (interval_ms=0)

    assert early.code is Code.TOO_EARLY and 0.2 < early.wait_seconds <= 0.3
    time.sleep(early.wait_seconds)
    assert gate.start(Start("k", second.ticket, 1)).ok


def test_a_finish_does_not_start_the_kept_grant_of_a_key_an_operator_paced(gate):
    run = gate.submit(Submission("k", b'{"task": "t", "id": "a"}', start=True))
    waiting = gate.submit(Submission("k", b'{"task": "t", "id": "b"}'))
    gate.set_overrides("k", interval_ms=1000)

    finished = gate.finish(
        Finish("k", run.ticket, run.token, keep_first_seconds=30, start_kept=KeptStart("t", 1, False))
    )

    [kept] = finished.granted
    assert kept.ticket == waiting.ticket and kept.token == 0, "its start decides, against the rate"
    assert gate.inspect("k").holders[waiting.ticket].state == "granted"


def test_a_set_and_a_clear_raced_leave_the_listing_agreeing_with_the_override(gate, gate_redis):
    """Each round a set and a clear of one key race in two threads; whichever script ran last decides the
    override, and the key is listed exactly when it has one (once listed, never hidden from the live page)."""
    barrier = threading.Barrier(2)

    def act(limit: int | None) -> None:
        barrier.wait()
        gate.set_overrides("k", limit=limit)

    for _ in range(300):
        threads = [threading.Thread(target=act, args=(limit,)) for limit in (2, None)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        overridden = gate.inspect("k").limit_override is not None
        if overridden:
            assert gate_redis.sismember(OVERRIDDEN_KEYS, "k"), "an override in force is listed"
        assert gate.overridden_keys() == (["k"] if overridden else [])
        assert bool(gate_redis.sismember(OVERRIDDEN_KEYS, "k")) == overridden
