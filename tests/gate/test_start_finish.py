"""start.lua and finish.lua: every return code, grants in order up to the limit, fencing tokens."""

from __future__ import annotations

import json
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_keyed_queue.gate import Code, Finish, Grant, KeptStart, Lease, Start, Submission
from django_keyed_queue.gate.keys import KeyNames
from tests.gate_redis import message_of, redis_names


def _server_ms(client) -> int:
    secs, micros = client.time()
    return secs * 1000 + micros // 1000


# --- start ---------------------------------------------------------------------------------


def test_start_of_a_granted_ticket_starts_its_lease(gate, gate_redis):
    ticket = gate.submit(Submission("k", b"m1")).ticket
    before_ms = _server_ms(gate_redis)

    started = gate.start(Start("k", ticket, 1))

    after_ms = _server_ms(gate_redis)
    assert started.ok and started.code is Code.OK
    assert started.token > 0 and started.attempts == 1
    # The deadline is on the server's clock: start time + the 30 s lease.
    assert before_ms + 30_000 <= started.lease_deadline_ms <= after_ms + 30_000
    state = gate.inspect("k")
    assert state.last_token == started.token
    running = state.holders[ticket]
    assert running.state == "running"
    assert (running.dispatch, running.token, running.attempts) == (1, started.token, 1)
    assert 29 < running.deadline_in <= 30


def test_start_of_a_parked_ticket_is_not_granted(gate):
    gate.submit(Submission("k", b"m1"))
    parked = gate.submit(Submission("k", b"m2")).ticket

    result = gate.start(Start("k", parked, 1))

    assert result.code is Code.NOT_GRANTED and not result.ok
    assert (result.token, result.attempts, result.lease_deadline_ms) == (0, 0, 0)
    state = gate.inspect("k")
    assert state.waiting == [parked] and parked not in state.holders
    assert state.last_token == 0


def test_start_of_a_finished_ticket_is_not_granted(gate):
    first = gate.submit(Submission("k", b"m1", start=True))
    gate.finish(Finish("k", first.ticket, first.token))

    assert gate.start(Start("k", first.ticket, 1)).code is Code.NOT_GRANTED


def test_start_of_an_unknown_ticket_or_key_is_not_granted_and_writes_nothing(gate, gate_redis):
    gate.submit(Submission("k", b"m1"))
    names = redis_names(gate_redis)

    assert gate.start(Start("k", 99, 1)).code is Code.NOT_GRANTED
    assert gate.start(Start("never-seen", 1, 1)).code is Code.NOT_GRANTED
    assert redis_names(gate_redis) == names


def test_second_start_of_the_same_dispatch_is_already_started(gate):
    ticket = gate.submit(Submission("k", b"m1")).ticket
    first = gate.start(Start("k", ticket, 1))

    again = gate.start(Start("k", ticket, 1))

    assert again.code is Code.ALREADY_STARTED
    assert (again.token, again.attempts) == (0, 1)
    state = gate.inspect("k")
    assert state.last_token == first.token, "a refused start takes no token"
    assert state.holders[ticket].token == first.token


def test_start_with_another_dispatch_is_stale(gate):
    ticket = gate.submit(Submission("k", b"m1")).ticket

    for dispatch in (0, 2, 7):
        result = gate.start(Start("k", ticket, dispatch))
        assert result.code is Code.STALE_DISPATCH
        assert result.token == 0
    assert gate.inspect("k").holders[ticket].state == "granted"
    assert gate.start(Start("k", ticket, 1)).ok


# --- finish --------------------------------------------------------------------------------


def test_finish_grants_the_next_ticket_with_its_message(gate, gate_redis):
    first = gate.submit(Submission("k", b"m1", start=True))
    gate.submit(Submission("k", b"m2"))
    gate.submit(Submission("k", b"m3"))

    done = gate.finish(Finish("k", first.ticket, first.token))

    assert done.ok and done.code is Code.OK
    assert done.granted == [Grant(key="k", ticket=2, dispatch=1, message=b"m2")]
    state = gate.inspect("k")
    assert list(state.holders) == [2]
    assert state.holders[2].state == "granted"
    assert 59 < state.holders[2].deadline_in <= 60
    assert state.waiting == [3]
    assert state.messages == 2
    assert message_of(gate_redis, "k", first.ticket) is None, "a finished ticket's message is dropped"


def _envelope(task: str) -> bytes:
    """A stored message of ``task`` as the producer writes it (compact, its name and id first)."""
    return json.dumps({"task": task, "id": task + "-id", "body": ""}, separators=(",", ":")).encode()


def test_finish_keeping_the_next_grant_starts_it_for_its_caller_when_of_the_same_task(gate):
    first = gate.submit(Submission("k", _envelope("t.a"), start=True))
    gate.submit(Submission("k", _envelope("t.a")))
    gate.submit(Submission("k", _envelope("t.a")))

    done = gate.finish(
        Finish("k", 1, first.token, keep_first_seconds=30, start_kept=KeptStart("t.a", max_lost=2, block=True))
    )

    [kept] = done.granted
    assert kept.ticket == 2 and kept.token > first.token and kept.attempts == 1
    running = gate.inspect("k").holders[2]
    assert (running.state, running.token, running.attempts, running.dispatch) == ("running", kept.token, 1, 1)
    assert 29 < running.deadline_in <= 30, "a lease from the finish"
    assert gate.start(Start("k", 2, 1)).code is Code.ALREADY_STARTED, "its message cannot start it twice"
    assert gate.kept_by("k", first.token) == (2, kept.token), "for a caller whose reply was lost"
    assert gate.kept_by("k", kept.token) is None
    assert gate.finish(Finish("k", 2, kept.token)).ok, "its token ends it"


def test_a_kept_grant_of_another_task_or_without_start_kept_is_only_granted(gate):
    first = gate.submit(Submission("k", _envelope("t.a"), start=True))
    gate.submit(Submission("k", _envelope("t.b")))
    gate.submit(Submission("k", _envelope("t.a")))

    other = gate.finish(Finish("k", 1, first.token, keep_first_seconds=5, start_kept=KeptStart("t.a", max_lost=3)))
    assert [(g.ticket, g.token, g.attempts) for g in other.granted] == [(2, 0, 0)]
    assert gate.inspect("k").holders[2].state == "granted"
    second = gate.start(Start("k", 2, 1))
    unasked = gate.finish(Finish("k", 2, second.token, keep_first_seconds=5))
    assert [(g.ticket, g.token) for g in unasked.granted] == [(3, 0)]
    assert gate.inspect("k").holders[3].state == "granted"


def test_a_kept_grant_given_back_unstarted_is_granted_again_with_its_attempt_uncounted(gate):
    first = gate.submit(Submission("k", _envelope("t.a"), start=True))
    gate.submit(Submission("k", _envelope("t.a")))
    [kept] = gate.finish(Finish("k", 1, first.token, keep_first_seconds=30, start_kept=KeptStart("t.a", 3))).granted

    assert gate.requeue(Lease("k", 2, kept.token), unstarted=True)

    holder = gate.inspect("k").holders[2]
    assert (holder.state, holder.attempts) == ("granted", 0)
    assert not gate.requeue(Lease("k", 2, kept.token), unstarted=True), "given back once"
    started = gate.start(Start("k", 2, 1))
    assert started.ok and started.attempts == 1


def test_finish_grants_next_tickets_in_order_up_to_the_limit(gate):
    first = gate.submit(Submission("k", b"m1", start=True))
    for n in range(2, 7):
        gate.submit(Submission("k", f"m{n}".encode()))

    done = gate.finish(Finish("k", first.ticket, first.token, limit=3))

    assert [(g.ticket, g.dispatch, g.message) for g in done.granted] == [(2, 1, b"m2"), (3, 1, b"m3"), (4, 1, b"m4")]
    state = gate.inspect("k")
    assert sorted(state.holders) == [2, 3, 4]
    assert state.waiting == [5, 6]


def test_finish_counts_the_slots_still_held(gate):
    first = gate.submit(Submission("k", b"m1", limit=2, start=True))
    second = gate.submit(Submission("k", b"m2", limit=2))
    assert second.granted
    for n in range(3, 6):
        gate.submit(Submission("k", f"m{n}".encode(), limit=2))

    done = gate.finish(Finish("k", first.ticket, first.token, limit=2))

    assert [g.ticket for g in done.granted] == [3], "ticket 2 still holds one of the two slots"
    assert sorted(gate.inspect("k").holders) == [2, 3]


def test_finish_of_the_last_ticket_grants_nothing(gate):
    only = gate.submit(Submission("k", b"m1", start=True))

    done = gate.finish(Finish("k", only.ticket, only.token))

    assert done.ok and done.granted == []
    state = gate.inspect("k")
    assert state.holders == {} and state.waiting == [] and state.messages == 0


def test_finish_on_a_paused_key_grants_nothing(gate, gate_redis):
    first = gate.submit(Submission("k", b"m1", start=True))
    gate.submit(Submission("k", b"m2"))
    gate_redis.hset(KeyNames("k").meta, "paused", "1")

    done = gate.finish(Finish("k", first.ticket, first.token))

    assert done.ok and done.granted == []
    state = gate.inspect("k")
    assert state.holders == {} and state.waiting == [2]
    assert state.idle_expires_in is None, "a key with waiting tickets is not idle"


def _assert_unchanged(gate, key, before):
    after = gate.inspect(key)
    for field in ("last_ticket", "last_token", "waiting", "messages", "paused"):
        assert getattr(after, field) == getattr(before, field), field
    assert {t: (h.state, h.token, h.dispatch) for t, h in after.holders.items()} == {
        t: (h.state, h.token, h.dispatch) for t, h in before.holders.items()
    }


def test_finish_with_a_wrong_token_is_stale_and_changes_nothing(gate):
    first = gate.submit(Submission("k", b"m1", start=True))
    gate.submit(Submission("k", b"m2"))
    before = gate.inspect("k")

    for token in (first.token + 1, 0, first.token - 1):
        assert gate.finish(Finish("k", first.ticket, token)).code is Code.STALE_TOKEN
    _assert_unchanged(gate, "k", before)
    assert gate.finish(Finish("k", first.ticket, first.token)).ok


def test_finish_of_a_granted_ticket_that_never_started_is_stale(gate):
    granted = gate.submit(Submission("k", b"m1"))
    gate.submit(Submission("k", b"m2"))
    before = gate.inspect("k")

    result = gate.finish(Finish("k", granted.ticket, 0))

    assert result.code is Code.STALE_TOKEN and result.granted == []
    _assert_unchanged(gate, "k", before)


def test_finish_of_an_unknown_or_finished_ticket_is_stale(gate):
    first = gate.submit(Submission("k", b"m1", start=True))
    gate.submit(Submission("k", b"m2"))

    assert gate.finish(Finish("k", 42, first.token)).code is Code.STALE_TOKEN
    assert gate.finish(Finish("other", first.ticket, first.token)).code is Code.STALE_TOKEN
    assert gate.finish(Finish("k", first.ticket, first.token)).ok
    twice = gate.finish(Finish("k", first.ticket, first.token))
    assert twice.code is Code.STALE_TOKEN and twice.granted == []
    assert list(gate.inspect("k").holders) == [2], "a second finish must not grant again"


# --- fencing tokens ------------------------------------------------------------------------


def test_fencing_tokens_strictly_increase_across_starts_and_retries(gate):
    tokens = []
    # With a task id: the drained key keeps its counters a minute (inspected at the end), not a millisecond.
    first = gate.submit(Submission("k", b"m1", start=True, task_id="t1"))
    tokens.append(first.token)
    for n in range(2, 6):
        gate.submit(Submission("k", f"m{n}".encode()))

    # Ticket 1 retries twice, then finishes; the others start, some retry, and finish.
    token = first.token
    for dispatch in (2, 3):
        assert gate.retry(Lease("k", 1, token), b"retry", countdown_seconds=0) == dispatch
        token = gate.start(Start("k", 1, dispatch)).token
        tokens.append(token)
    granted = gate.finish(Finish("k", 1, token)).granted
    while granted:
        (grant,) = granted
        started = gate.start(Start("k", grant.ticket, grant.dispatch))
        tokens.append(started.token)
        token = started.token
        if grant.ticket % 2 == 0:
            dispatch = gate.retry(Lease("k", grant.ticket, token), b"retry", countdown_seconds=0)
            token = gate.start(Start("k", grant.ticket, dispatch)).token
            tokens.append(token)
        granted = gate.finish(Finish("k", grant.ticket, token)).granted

    assert tokens == sorted(set(tokens)), f"tokens not strictly increasing: {tokens}"
    assert tokens == list(range(tokens[0], tokens[0] + 9)), "one token per start, none skipped"
    assert gate.inspect("k").last_token == tokens[-1]


def test_fencing_tokens_continue_after_the_key_went_idle(gate):
    # Task ids keep the drained key's counters while its submissions are remembered; a key with none
    # may expire within a millisecond, and its tickets start over (its tokens still go on, above).
    first = gate.submit(Submission("k", b"m1", start=True, task_id="t1"))
    gate.finish(Finish("k", first.ticket, first.token))
    assert gate.inspect("k").idle_expires_in is not None

    second = gate.submit(Submission("k", b"m2", start=True, task_id="t2"))

    assert second.ticket == first.ticket + 1
    assert second.token > first.token


def test_fencing_tokens_are_per_key(gate):
    # The keys' starts interleave, so one counter shared by both would skip a token on each.
    # A second ticket waits on each key, so neither drains between its two starts: a drained
    # key may expire at once and go on in a new epoch, which the test above covers.
    firsts = {key: gate.submit(Submission(key, b"m", start=True)) for key in ("a", "b")}
    for key in firsts:
        gate.submit(Submission(key, b"m"))
    seconds = {}
    for key, first in firsts.items():
        (grant,) = gate.finish(Finish(key, first.ticket, first.token)).granted
        seconds[key] = gate.start(Start(key, grant.ticket, grant.dispatch)).token

    for key, first in firsts.items():
        assert seconds[key] == first.token + 1, f"key {key!r} counts its own starts"


def test_only_the_ticket_s_own_message_may_start_it(gate):
    ticket = gate.submit(Submission("k", json.dumps({"task": "t", "id": "own-id"}).encode())).ticket
    other = gate.submit(Submission("other", b"not json")).ticket
    assert gate.start(Start("k", ticket, 1, task_id="copied-header")).code is Code.FOREIGN_MESSAGE
    assert gate.start(Start("other", other, 1, task_id="any")).code is Code.FOREIGN_MESSAGE, (
        "an unreadable stored message"
    )
    assert gate.inspect("k").holders[ticket].state == "granted", "a refused start changes nothing"
    assert gate.start(Start("k", ticket, 1, task_id="own-id")).ok


#: Task names and ids as users and attackers make them: quotes and backslashes (escaped in the stored
#: JSON), unicode (escaped, or not), NUL, huge, and a name that spells another id's field.
NAMES = st.one_of(
    st.text(st.characters(codec="utf-8"), max_size=30),
    st.text(alphabet='"\\\x00é,:{}id', max_size=12),
    st.just('t","id":"victim'),
    st.just("x" * 3000),
)


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(
    task=NAMES, task_id=NAMES.filter(bool), other=NAMES.filter(bool), compact=st.booleans(), ascii_only=st.booleans()
)
def test_a_start_reads_the_id_a_stored_message_names_in_any_form(gate, task, task_id, other, compact, ascii_only):
    """start.lua reads the producer's compact envelope's first fields without decoding it whole; the id it
    reads is the one JSON says, in every form a message may be stored in (an empty id is not checked)."""
    envelope = {"task": task, "id": task_id, "content_type": "application/json", "body": "e30="}
    separators = (",", ":") if compact else (", ", ": ")
    stored = json.dumps(envelope, separators=separators, ensure_ascii=ascii_only).encode()
    key = f"k{uuid.uuid4()}"  # a free key each example
    ticket = gate.submit(Submission(key, stored)).ticket
    if other != task_id:
        assert gate.start(Start(key, ticket, 1, task_id=other)).code is Code.FOREIGN_MESSAGE
    started = gate.start(Start(key, ticket, 1, task_id=task_id))
    assert started.ok
    gate.finish(Finish(key, ticket, started.token))


@pytest.mark.parametrize("task", ["t|with|bars", "tâche \u2603", "nul\x00inside", "x" * 5000])
def test_a_kept_start_takes_any_task_name_and_only_a_stored_message_of_it(gate, gate_redis, task):
    first = gate.submit(Submission("k", _envelope(task), start=True))
    gate.submit(Submission("k", _envelope(task)))
    gate.submit(Submission("k", b"not json \xff"))
    gate.submit(Submission("k", _envelope(task)))
    start = KeptStart(task, max_lost=1)

    kept = gate.finish(Finish("k", 1, first.token, keep_first_seconds=30, start_kept=start)).granted[0]
    assert (kept.ticket, kept.attempts) == (2, 1) and kept.token > 0
    garbled = gate.finish(Finish("k", 2, kept.token, keep_first_seconds=30, start_kept=start)).granted[0]
    assert (garbled.ticket, garbled.token) == (3, 0), "a stored message that is not JSON is only granted"
    gate_redis.hset(KeyNames("k").meta, "kept", b"1|2|x")  # someone else's write
    assert gate.kept_by("k", 1) is None
