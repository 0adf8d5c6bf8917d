"""The deadline index and a key's holders agree after every call, whatever a reaper's pass interleaves.

A reaper's pass reads the due keys with their scores, runs ``reap.lua`` on each, then moves each
key to its next deadline, or removes it when ``reap.lua`` found it empty (``reindex.lua``), unless
the key's score changed since it was read. A submission that granted the key a new holder between
the two halves once kept the key's earlier score (``ZADD LT``), so the pass removed it: the grant
had no deadline entry, and a lost message of it stranded the key for good. Here a stateful test
interleaves submissions, starts and finishes with the two halves of passes, and after every step
each key with a holder must be indexed no later than its earliest deadline.
"""

from __future__ import annotations

import itertools
import time

from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from django_keyed_queue.gate import Finish, Gate, Start, Submission
from django_keyed_queue.gate.keys import KeyNames
from tests.gate_redis import index_scores, set_index_scores

KEYS = ("a", "b")
_examples = itertools.count()


def _due_now(gate: Gate, keys: list[str]) -> None:
    """Time passes: each key's deadline entry falls due (the test's leases never end by themselves)."""
    present = index_scores(gate.client, gate.deadlines)
    set_index_scores(gate.client, gate.deadlines, {k: 0 for k in keys if k in present}, xx=True)


def test_a_submission_between_a_pass_s_visit_and_its_reindex_keeps_its_deadline_entry(gate):
    gate.submit(Submission("k", b"first", task_id="t1"))
    first = gate.start(Start("k", 1, 1))
    assert gate.finish(Finish("k", 1, first.token)).ok  # drained
    _due_now(gate, ["k"])
    now_ms = int(time.time() * 1000)
    due = [(m, s) for m, s in gate._index_range_with_scores(now_ms) if m in (b"k", "k")]
    _, moves = gate._reap_each(due, now_ms)
    assert [move[2] for move in moves] == [-1], "the visit found the key empty"

    again = gate.submit(Submission("k", b"second", task_id="t2"))
    assert again.granted
    gate._reindex(moves)

    scores = index_scores(gate.client, gate.deadlines)
    assert "k" in scores, "the new grant's deadline entry was removed"
    assert scores["k"] < 1, "it stays due: the next pass visits it"
    gate.reap()
    [deadline_in] = [h.deadline_in for h in gate.inspect("k").holders.values()]
    assert 0 < index_scores(gate.client, gate.deadlines)["k"] - time.time() * 1000 <= deadline_in * 1000 + 50


class DeadlineIndexModel(RuleBasedStateMachine):
    def __init__(self, gate: Gate) -> None:
        super().__init__()
        self.gate = gate
        example = next(_examples)
        self.keys = [f"index{example}:{k}" for k in KEYS]
        self.task_ids = itertools.count(1)
        #: The pass under way: the (key, score) pairs it read, then the moves its visit computed.
        self.read: list[tuple[bytes | str, float]] | None = None
        self.moves: list[tuple[str, float, int]] | None = None

    def teardown(self) -> None:
        for key in self.keys:
            self.gate.client.delete(*KeyNames(key).all(), KeyNames(key).recent, KeyNames(key).recent_older)
            self.gate.client.zrem(self.gate.deadlines.shard_of(key), key)

    def _holders(self, state: str) -> list[tuple[str, int, int]]:
        """(key, ticket, dispatch or token) of every holder in ``state``, as the gate shows them."""
        found = []
        for key, seen in zip(self.keys, self.gate.inspect_many(self.keys), strict=True):
            for ticket, h in sorted(seen.holders.items()):
                if h.state == state:
                    found.append((key, ticket, h.token if state == "running" else h.dispatch))
        return found

    @rule(key=st.sampled_from(range(len(KEYS))), limit=st.sampled_from([1, 2]))
    def submit(self, key: int, limit: int) -> None:
        self.gate.submit(Submission(self.keys[key], b"m", limit=limit, task_id=f"t{next(self.task_ids)}"))

    @rule(pick=st.integers(0, 10))
    def start(self, pick: int) -> None:
        granted = self._holders("granted")
        if granted:
            key, ticket, dispatch = granted[pick % len(granted)]
            assert self.gate.start(Start(key, ticket, dispatch)).ok

    @rule(pick=st.integers(0, 10), limit=st.sampled_from([1, 2]))
    def finish(self, pick: int, limit: int) -> None:
        running = self._holders("running")
        if running:
            key, ticket, token = running[pick % len(running)]
            assert self.gate.finish(Finish(key, ticket, token, limit=limit)).ok

    @precondition(lambda self: self.read is None)
    @rule()
    def pass_reads(self) -> None:
        _due_now(self.gate, self.keys)
        ours = {k.encode() for k in self.keys} | set(self.keys)
        self.read = [(m, s) for m, s in self.gate._index_range_with_scores(int(time.time() * 1000)) if m in ours]

    @precondition(lambda self: self.read is not None and self.moves is None)
    @rule()
    def pass_visits(self) -> None:
        assert self.read is not None
        recoveries, self.moves = self.gate._reap_each(self.read, int(time.time() * 1000))
        assert recoveries == [], "no lease or dispatch timeout passes here"

    @precondition(lambda self: self.moves is not None)
    @rule()
    def pass_reindexes(self) -> None:
        assert self.moves is not None
        self.gate._reindex(self.moves)
        self.read = self.moves = None

    @invariant()
    def every_holder_has_a_deadline_entry_no_later_than_its_deadline(self) -> None:
        scores = index_scores(self.gate.client, self.gate.deadlines)
        now_ms = time.time() * 1000
        for key, seen in zip(self.keys, self.gate.inspect_many(self.keys), strict=True):
            if not seen.holders:
                continue
            assert key in scores, f"{key} holds {sorted(seen.holders)} with no deadline entry"
            earliest = min(h.deadline_in for h in seen.holders.values())
            assert scores[key] <= now_ms + earliest * 1000 + 50, f"{key} is indexed after its earliest deadline"


#: About 5 s on one server. The same examples on every run (see test_model.py's SEED).
INDEX_MODEL_SETTINGS = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    phases=[Phase.explicit, Phase.generate, Phase.shrink],
    report_multiple_bugs=False,
)


def test_the_deadline_index_covers_every_holder_through_interleaved_passes(gate):
    machine = seed(3)(lambda: DeadlineIndexModel(gate))
    run_state_machine_as_test(machine, settings=INDEX_MODEL_SETTINGS)
