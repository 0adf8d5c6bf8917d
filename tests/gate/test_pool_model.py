"""A stateful model test of pools: keys of limit 1 whose tasks all share one pool, driven as workers drive them.

Hypothesis submits tickets and delivers their messages (``start`` with the pool: one call on one server, the pool
then the key on a Redis Cluster), duplicates and stale copies, and workers paused between the pool's answer and the
key's (the cluster's calls apart, interleaved with others). Runs finish, retry or are requeued, giving their slot
back or dying first; leases are lost; slots expire; the reaper passes over the pools and asks them again for tickets
waiting; operators cancel. A model keeps the messages in flight, the runs and the ends; after each step the gate's
truth must keep the pool's limit (P1), every run's slot (P2), each key's exclusion and order (P3), no second start
of a grant nor any of an ended ticket (P4), and every ticket waiting for its pool in the pool's line (P5). At the end
everything is drained: every ticket submitted and not cancelled ends exactly once (liveness).
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass

from hypothesis import seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from django_keyed_queue.gate import (
    Cancel,
    Code,
    Finish,
    Gate,
    Lease,
    Pool,
    PoolAcquired,
    RecoveryAction,
    Start,
    Submission,
)
from django_keyed_queue.gate.keys import POOLS, KeyNames, PoolNames, pool_member
from tests.gate.test_model import MODEL_SETTINGS

#: Four keys of limit 1 share one pool: more keys than slots, so tickets wait for the pool.
KEY_COUNT = 4

#: Which candidate a rule acts on (modulo their number): small, so examples shrink well.
PICK = st.integers(min_value=0, max_value=7)

#: Drain rounds before the liveness check gives up: each round ends every run and frees every slot.
DRAIN_ROUNDS = 200

#: Workers paused at once between the pool's answer and the key's.
MOST_PAUSED = 3

_examples = itertools.count()


def _task_id(key: str, ticket: int) -> str:
    return f"{key}#{ticket}"


def _message(task_id: str) -> bytes:
    # With a task id, as a worker's messages carry: a drained key keeps its counters a generation (tickets are not
    # numbered afresh within an example, whatever the clock), and a start checks the message is the ticket's own.
    return json.dumps({"task": "pooled.task", "id": task_id}).encode()


@dataclass(frozen=True)
class Message:
    """A published message of a ticket: only its dispatch may start it."""

    key: str
    ticket: int
    dispatch: int


@dataclass(frozen=True)
class Run:
    ticket: int
    token: int
    dispatch: int


@dataclass(frozen=True)
class Paused:
    """A worker between the pool's answer and the key's."""

    message: Message
    acquired: PoolAcquired

    @property
    def code(self) -> Code:
        return self.acquired.code


class PoolModel(RuleBasedStateMachine):
    def __init__(self, gate: Gate) -> None:
        super().__init__()
        self.gate = gate
        example = next(_examples)  # fresh keys and pool per example: nothing carries over
        self.keys = [f"pool-model{example}:k{i}" for i in range(KEY_COUNT)]
        self.pool = Pool(f"pool-model{example}", limit=2, interval_ms=0)
        self.names = PoolNames(self.pool.name)
        self.in_flight: list[Message] = []
        #: Every message ever published, for duplicates and stale copies.
        self.published: list[Message] = []
        self.paused: list[Paused] = []
        #: The run of each key (limit 1: at most one).
        self.running: dict[str, Run] = {}
        self.last_ticket = dict.fromkeys(self.keys, 0)
        self.max_lost: dict[tuple[str, int], int] = {}
        self.lost: dict[tuple[str, int], int] = {}
        #: (key, ticket) -> how it ended.
        self.ended: dict[tuple[str, int], str] = {}
        #: Grants that started: each starts once (a requeued run's message may start it again).
        self.started: set[Message] = set()
        #: Tickets of each key in the order they started.
        self.starts: dict[str, list[int]] = {key: [] for key in self.keys}
        # Steps begun and invariant checks passed: the final drain runs only after a clean run.
        self.steps = 0
        self.checked = 0

    # --- the model's bookkeeping ---------------------------------------------------------------

    def _publish(self, message: Message) -> None:
        assert message.key in self.keys, f"a grant of a key not ours: {message}"
        self.in_flight.append(message)
        self.published.append(message)

    def _granted(self, grants) -> None:
        for g in grants:
            self._publish(Message(g.key, g.ticket, g.dispatch))

    def _end(self, key: str, ticket: int, how: str) -> None:
        assert (key, ticket) not in self.ended, f"{key} ticket {ticket} ended twice ({self.ended[key, ticket]}, {how})"
        self.ended[key, ticket] = how
        if key in self.running and self.running[key].ticket == ticket:
            del self.running[key]

    def _recovered(self, recoveries) -> None:
        """Publish what the reaper (or a release) recovered; the model follows its ends and lost runs."""
        for r in recoveries:
            assert r.key in self.keys, f"a recovery of a key not ours: {r}"
            assert r.action not in (RecoveryAction.BLOCK, RecoveryAction.OUTCOME), f"unexpected {r}"
            if r.action in (RecoveryAction.REDISPATCH, RecoveryAction.FAIL):
                run = self.running.pop(r.key, None)
                assert run is not None and run.ticket == r.ticket, f"{r} of a ticket not running ({run})"
                self.lost[r.key, r.ticket] = self.lost.get((r.key, r.ticket), 0) + 1
                if r.action is RecoveryAction.FAIL:
                    self._end(r.key, r.ticket, "failed")
            if r.publishes:
                self._publish(Message(r.key, r.ticket, r.dispatch))

    def _started(self, message: Message, token: int) -> None:
        key, ticket = message.key, message.ticket
        # P4: a grant starts once; an ended ticket never again.
        assert message not in self.started, f"{message} started twice"
        assert (key, ticket) not in self.ended, f"{key} ticket {ticket} started after it ended"
        # P3: one run per key, its tickets in order (a ticket whose run was lost or retried starts again).
        assert key not in self.running, f"{key} started {ticket} beside {self.running.get(key)}"
        assert not self.starts[key] or ticket >= self.starts[key][-1], (
            f"{key} started {ticket} after {self.starts[key]}"
        )
        self.started.add(message)
        self.starts[key].append(ticket)
        self.running[key] = Run(ticket, token, message.dispatch)

    def _given_slots(self) -> set[str]:
        """Members whose slot a paused worker was just given: it starts them at once."""
        return {pool_member(p.message.key, p.message.ticket) for p in self.paused if p.code is Code.OK}

    def _waiting_for_pool(self) -> list[tuple[str, int]]:
        return [
            (snapshot.key, ticket)
            for snapshot in self.gate.inspect_many(self.keys, task_ids=False)
            for ticket, holder in sorted(snapshot.holders.items())
            if holder.state == "waiting_for_pool"
        ]

    @staticmethod
    def _pick(pick: int, candidates: list):
        return candidates[pick % len(candidates)]

    # --- a worker ------------------------------------------------------------------------------

    def _start(self, message: Message) -> None:
        """A worker starts a delivered message: its pool and its key, as the gate asks them."""
        key, ticket = message.key, message.ticket
        start = Start(
            key, ticket, message.dispatch, max_lost=self.max_lost[key, ticket], task_id=_task_id(key, ticket),
            pool=self.pool,
        )  # fmt: skip
        started = self.gate.start(start)
        self._granted(started.granted)
        if started.ok:
            self._started(message, started.token)
        else:  # PARKED: it waits for its pool; else a copy the key refuses. Dropped either way.
            assert started.code in (Code.PARKED, Code.NOT_GRANTED, Code.STALE_DISPATCH, Code.ALREADY_STARTED), (
                f"{message}: {started.code.name}"
            )

    def _ask_the_pool(self, message: Message) -> None:
        """The first call of a start on a Redis Cluster (``Gate.start`` on a cluster); the worker pauses after it."""
        acquired = self.gate.pool_acquire(self.pool, message.key, message.ticket)
        self._granted(acquired.granted)
        assert acquired.code in (Code.OK, Code.PARKED), f"{message}: the pool said {acquired.code.name}"
        self.paused.append(Paused(message, acquired))

    def _ask_the_key(self, paused: Paused) -> None:
        """The rest of that start, as the gate makes it (``Gate.start_after_pool``): the pool said wait, or the key
        is asked, and the slot checked once it started."""
        key, ticket, dispatch = paused.message.key, paused.message.ticket, paused.message.dispatch
        start = Start(
            key, ticket, dispatch, max_lost=self.max_lost[key, ticket], task_id=_task_id(key, ticket), pool=self.pool
        )
        started = self.gate.start_after_pool(paused.acquired, start)
        self._granted(started.granted)
        if started.ok:
            self._started(paused.message, started.token)
        else:
            assert started.code in (Code.PARKED, Code.NOT_GRANTED, Code.STALE_DISPATCH, Code.ALREADY_STARTED), (
                f"{paused}: {started.code.name}"
            )

    def _finish(self, key: str, *, dies: bool) -> None:
        """A run ends; ``dies``: its process died before its pool heard (the calls apart of a Redis Cluster)."""
        run = self.running[key]
        done = self.gate.finish(Finish(key, run.ticket, run.token, pool=None if dies else self.pool.name))
        assert done.code is Code.OK, f"{key} ticket {run.ticket} finished: {done.code.name}"
        self._end(key, run.ticket, "succeeded")
        self._granted(done.granted)

    def _expire(self, member: str) -> None:
        """Its slot's deadline passed (its worker died, or its release was lost): no sleeping."""
        self.gate.client.zadd(self.names.running, {member: 1}, xx=True)

    def _ask_again(self, key: str, ticket: int) -> None:
        """The reaper's ask of the pool for a ticket still waiting for it at its deadline (a release: now)."""
        recoveries = self.gate.release(key, ticket)
        own = [r.action for r in recoveries if (r.key, r.ticket) == (key, ticket)]
        assert own in ([RecoveryAction.POOL], [RecoveryAction.GRANT]), f"{key} ticket {ticket} asked again: {own}"
        self._recovered(recoveries)

    # --- rules ---------------------------------------------------------------------------------

    @initialize(limit=st.sampled_from([2, 1]))
    def pool_limit(self, limit: int) -> None:
        self.steps += 1
        self.pool = Pool(self.pool.name, limit=limit, interval_ms=0)

    @rule(key=st.integers(min_value=0, max_value=KEY_COUNT - 1), max_lost=st.integers(min_value=0, max_value=1))
    def submit(self, key: int, max_lost: int) -> None:
        """A new task; ``max_lost`` 1: a lost lease dispatches it once more (it keeps its key)."""
        self.steps += 1
        name = self.keys[key]
        ticket = self.last_ticket[name] + 1
        submitted = self.gate.submit(Submission(name, _message(_task_id(name, ticket)), task_id=_task_id(name, ticket)))
        assert submitted is not None and submitted.ticket == ticket, f"{name} took {submitted}, not {ticket}"
        self.last_ticket[name] = ticket
        self.max_lost[name, ticket] = max_lost
        if submitted.granted:
            self._publish(Message(name, ticket, 1))

    @precondition(lambda self: self.in_flight)
    @rule(pick=PICK, pause=st.booleans())
    def deliver(self, pick: int, pause: bool) -> None:
        """A message reaches a worker; ``pause``: it asks the pool, and stalls before the key."""
        self.steps += 1
        message = self.in_flight.pop(pick % len(self.in_flight))
        if pause and len(self.paused) < MOST_PAUSED:
            self._ask_the_pool(message)
        else:
            self._start(message)

    @precondition(lambda self: self.published)
    @rule(pick=PICK, pause=st.booleans())
    def deliver_a_copy(self, pick: int, pause: bool) -> None:
        """At least once: a copy of any message published so far, in flight, delivered or stale."""
        self.steps += 1
        message = self._pick(pick, self.published)
        if pause and len(self.paused) < MOST_PAUSED:
            self._ask_the_pool(message)
        else:
            self._start(message)

    @precondition(lambda self: self.paused)
    @rule(pick=PICK)
    def paused_worker_goes_on(self, pick: int) -> None:
        self.steps += 1
        self._ask_the_key(self.paused.pop(pick % len(self.paused)))

    @precondition(lambda self: self.running)
    @rule(pick=PICK, dies=st.booleans())
    def finish(self, pick: int, dies: bool) -> None:
        """A run ends and its slot goes back; ``dies``: its slot is held until it expires."""
        self.steps += 1
        self._finish(self._pick(pick, sorted(self.running)), dies=dies)

    @precondition(lambda self: self.running)
    @rule(pick=PICK, requeue=st.booleans(), dies=st.booleans())
    def retry(self, pick: int, requeue: bool, dies: bool) -> None:
        """``self.retry()`` (its next dispatch) or ``Reject(requeue=True)`` (the same message again): the ticket keeps
        its key, and gives its pool slot back before its message goes out (``dies``: it died first)."""
        self.steps += 1
        key = self._pick(pick, sorted(self.running))
        run = self.running.pop(key)
        if requeue:
            assert self.gate.requeue(Lease(key, run.ticket, run.token))
            message = Message(key, run.ticket, run.dispatch)
            self.started.discard(message)  # the same grant may start it again
        else:
            retried = _message(_task_id(key, run.ticket))
            dispatch = self.gate.retry(Lease(key, run.ticket, run.token), retried, countdown_seconds=0)
            assert dispatch == run.dispatch + 1, f"{key} ticket {run.ticket} retried with dispatch {dispatch}"
            message = Message(key, run.ticket, dispatch)
        if not dies:
            self._granted(self.gate.pool_release(self.pool.name, [(key, run.ticket)]))
        self._publish(message)

    @precondition(lambda self: self.running)
    @rule(pick=PICK)
    def lose_lease(self, pick: int) -> None:
        """A run's worker died: recovered now (dispatched again, or failed); its pool slot stays until it expires."""
        self.steps += 1
        key = self._pick(pick, sorted(self.running))
        run = self.running[key]
        again = self.lost.get((key, run.ticket), 0) < self.max_lost[key, run.ticket]
        recoveries = self.gate.release(key, run.ticket)
        own = [(r.action, r.dispatch) for r in recoveries if (r.key, r.ticket) == (key, run.ticket)]
        expected = (RecoveryAction.REDISPATCH, run.dispatch + 1) if again else (RecoveryAction.FAIL, run.dispatch)
        assert own == [expected], f"{key} ticket {run.ticket} lost its lease: {own}"
        self._recovered(recoveries)

    @precondition(lambda self: self.running)
    @rule()
    def renew(self) -> None:
        """A worker's heartbeat: its runs' leases and their pool slots, held another lease."""
        self.steps += 1
        leases = [Lease(key, run.ticket, run.token) for key, run in sorted(self.running.items())]
        assert self.gate.renew(leases) == dict.fromkeys(leases, True)
        assert self.gate.pool_renew(self.pool.name, leases) == dict.fromkeys(leases, True), "a run holds its slot"

    @rule(pick=PICK)
    def expire_a_slot(self, pick: int) -> None:
        """A slot no live worker renews reaches its deadline: never a run's (it renews it), nor one a paused worker
        was just given (it starts at once)."""
        self.steps += 1
        live = {pool_member(key, run.ticket) for key, run in self.running.items()} | self._given_slots()
        members = [m.decode() for m in self.gate.client.zrange(self.names.running, 0, -1)]
        candidates = [m for m in members if m not in live]
        if candidates:
            self._expire(self._pick(pick, candidates))

    @rule()
    def reap_pools(self) -> None:
        """The reaper's pass over the pools: expired slots go to the tickets waiting."""
        self.steps += 1
        self._recovered(self.gate.reap_pools())

    @rule(pick=PICK)
    def ask_the_pool_again(self, pick: int) -> None:
        self.steps += 1
        waiting = self._waiting_for_pool()
        if waiting:
            self._ask_again(*self._pick(pick, waiting))

    @rule(pick=PICK)
    def cancel(self, pick: int) -> None:
        """An operator withdraws a ticket not running: waiting in its key, granted or waiting for its pool."""
        self.steps += 1
        running = {(key, run.ticket) for key, run in self.running.items()}
        candidates = [
            (key, ticket)
            for key in self.keys
            for ticket in range(1, self.last_ticket[key] + 1)
            if (key, ticket) not in self.ended and (key, ticket) not in running
        ]
        if not candidates:
            return
        key, ticket = self._pick(pick, candidates)
        done = self.gate.cancel(Cancel(key, ticket))
        assert done.code is Code.OK, f"{key} ticket {ticket} cancelled: {done.code.name}"
        self._end(key, ticket, "cancelled")
        self._granted(done.granted)

    # --- after every step ----------------------------------------------------------------------

    @invariant()
    def the_pool_and_the_keys_hold(self) -> None:
        snapshots = self.gate.inspect_many(self.keys, task_ids=False)
        slots = {m.decode() for m in self.gate.client.zrange(self.names.running, 0, -1)}
        line = {m.decode() for m in self.gate.client.zrange(self.names.ready, 0, -1)}
        limit = self.pool.limit
        runs = {(s.key, t, h.token) for s in snapshots for t, h in s.holders.items() if h.state == "running"}
        assert runs == {(key, run.ticket, run.token) for key, run in self.running.items()}, "the runs"
        # P1: the pool's limit, over every key.
        assert len(runs) <= limit, f"{len(runs)} run, pool limit {limit}: {sorted(runs)}"
        assert len(slots) <= limit, f"{len(slots)} slots held, pool limit {limit}: {sorted(slots)}"
        # P2: a run holds its slot.
        for key, ticket, _ in runs:
            assert pool_member(key, ticket) in slots, f"{key} ticket {ticket} runs without its pool slot {slots}"
        given = self._given_slots()
        for s in snapshots:
            # P3: a key of limit 1 has one holder at most, running or not.
            assert len(s.holders) <= 1, f"{s.key} holders {s.holders}"
            for ticket in range(1, s.last_ticket + 1):
                places = [ticket in s.waiting, ticket in s.holders, (s.key, ticket) in self.ended]
                assert places.count(True) == 1, f"{s.key} ticket {ticket}: waiting, holding, ended = {places}"
            # P5: a ticket waiting for its pool is in the pool's line, which serves it as soon as a slot frees (else
            # only the reaper's ask, a dispatch timeout later, brings it back); or a paused worker was given its slot.
            for ticket, holder in s.holders.items():
                member = pool_member(s.key, ticket)
                if holder.state == "waiting_for_pool" and member not in given:
                    assert member in line, f"{s.key} ticket {ticket} waits for its pool, not in its line {line}"
        self.checked += 1

    # --- the end: drain, then every ticket ended once --------------------------------------------

    def teardown(self) -> None:
        try:
            # Every step passed its check (the first, initialize's, included): else its failure is the one to see.
            if self.checked == self.steps:
                self._drain()
        finally:
            client = self.gate.client
            for key in self.keys:
                client.delete(*KeyNames(key).all())
                client.zrem(self.gate.deadlines.shard_of(key), key)
            client.delete(*self.names.all())
            client.srem(POOLS, self.pool.name)

    def _drain(self) -> None:
        for _ in range(DRAIN_ROUNDS):
            while self.paused:
                self._ask_the_key(self.paused.pop(0))
            while self.in_flight:
                self._start(self.in_flight.pop(0))
            for key in sorted(self.running):
                self._finish(key, dies=False)
            for member in self.gate.client.zrange(self.names.running, 0, -1):
                self._expire(member.decode())
            self._recovered(self.gate.reap_pools())
            for key, ticket in self._waiting_for_pool():
                if (key, ticket) in self._waiting_for_pool():  # an ask before may have given it a slot
                    self._ask_again(key, ticket)
            self.the_pool_and_the_keys_hold()
            snapshots = self.gate.inspect_many(self.keys, task_ids=False)
            if not self.in_flight and not self.running and all(not s.holders and not s.waiting for s in snapshots):
                break
        else:
            raise AssertionError(
                f"not drained after {DRAIN_ROUNDS} rounds: in flight {self.in_flight}, running {self.running}, "
                f"keys {self.gate.inspect_many(self.keys, task_ids=False)}"
            )
        submitted = {(key, t) for key in self.keys for t in range(1, self.last_ticket[key] + 1)}
        assert set(self.ended) == submitted, f"never ended: {sorted(submitted - set(self.ended))}"
        assert self.gate.client.zcard(self.names.ready) == 0, "the pool's line is empty once nothing waits"


#: The key model's settings (no deadline, no explain phase, no example database), fewer and shorter examples.
POOL_MODEL_SETTINGS = settings(MODEL_SETTINGS, max_examples=100, stateful_step_count=50)

#: The same examples on every run of the same test selection.
SEED = 5


def test_pooled_keys_keep_the_pool_s_limit_and_all_end(gate):
    machine = seed(SEED)(lambda: PoolModel(gate))
    run_state_machine_as_test(machine, settings=POOL_MODEL_SETTINGS)


# --- the shortest examples the model found (the gate's bugs) ----------------------------------------


def test_a_stale_copy_given_the_slot_of_a_ticket_about_to_wait_does_not_strand_it(gate, gate_redis):
    """P5, the calls of two starts apart (a Redis Cluster's), interleaved: the pool tells dispatch 2's worker to wait;
    before that worker's ``pool_wait``, a stale copy (dispatch 1) is handed the ticket's slot, first in line. Its key
    refuses it as stale, and the slot goes to the ticket: published again (dispatch 3), not left waiting with it."""
    one, names = Pool("one", limit=1, interval_ms=0), PoolNames("one")
    held, waiting = (
        gate.submit(Submission(k, _message(_task_id(k, 1)), task_id=_task_id(k, 1))).ticket for k in ("a", "b")
    )
    run = gate.start(Start("a", held, 1, task_id=_task_id("a", held), pool=one))
    assert run.ok
    assert [(r.action, r.dispatch) for r in gate.release("b", waiting)] == [(RecoveryAction.REPUBLISH, 2)]
    second = gate.pool_acquire(one, "b", waiting)  # dispatch 2's worker, before its key
    assert second.code is Code.PARKED
    # a's run ends, its process dies before its pool hears, and its slot's deadline passes.
    assert gate.finish(Finish("a", held, run.token)).ok
    gate_redis.zadd(names.running, {pool_member("a", held): 1})

    stale = gate.pool_acquire(one, "b", waiting)  # dispatch 1's copy: b, first in the line, takes the freed slot
    assert (stale.code, stale.given) == (Code.OK, True)
    refused = gate.start_after_pool(stale, Start("b", waiting, 1, task_id=_task_id("b", waiting), pool=one))
    assert refused.code is Code.STALE_DISPATCH
    assert [(g.key, g.ticket, g.dispatch) for g in refused.granted] == [("b", waiting, 3)], "the slot is b's"
    assert gate.start_after_pool(second, Start("b", waiting, 2, pool=one)).code is Code.PARKED  # dispatch 2's goes on

    assert gate.inspect("b").holders[waiting].state == "granted", "not left waiting: dispatch 3 is out"
    assert gate.start(Start("b", waiting, 3, task_id=_task_id("b", waiting), pool=one)).ok


def test_a_start_whose_pool_slot_a_requeue_gave_back_does_not_run_beyond_the_limit(gate, gate_redis):
    """P1 and P2, the calls of a start apart (a Redis Cluster's): worker A is given the ticket's slot and stalls before
    its key; a copy's worker B starts the ticket on the same slot (a ticket's slot is its member's, whatever the
    message), and its run is requeued (``Reject(requeue=True)``: the same dispatch may start again) and gives the slot
    back. Another ticket takes the slot. A's start then finds its slot gone once its key started it: it is undone,
    and the pool asked again says wait."""
    one, names = Pool("one", limit=1, interval_ms=0), PoolNames("one")
    a, c = (gate.submit(Submission(k, _message(_task_id(k, 1)), task_id=_task_id(k, 1))).ticket for k in ("a", "c"))
    paused = gate.pool_acquire(one, "a", a)  # worker A, before its key
    assert paused.ok
    copy = gate.start(Start("a", a, 1, task_id=_task_id("a", a), pool=one))  # worker B, a copy of the same message
    assert copy.ok
    assert gate.requeue(Lease("a", a, copy.token))
    assert gate.pool_release("one", [("a", a)]) == []  # B gives the slot back, as a requeued run does
    assert gate.start(Start("c", c, 1, task_id=_task_id("c", c), pool=one)).ok

    resumed = gate.start_after_pool(paused, Start("a", a, 1, task_id=_task_id("a", a), pool=one))  # worker A goes on

    assert resumed.code is Code.PARKED
    runs = [k for k in ("a", "c") for h in gate.inspect(k).holders.values() if h.state == "running"]
    assert runs == ["c"], f"{runs} run in a pool of limit 1; its slots {gate_redis.zrange(names.running, 0, -1)}"
    assert gate.inspect("a").holders[a].state == "waiting_for_pool" and gate.inspect("a").holders[a].attempts == 1


def test_the_reaper_s_pass_serves_a_pool_its_tasks_only_started_and_finished_in(gate, gate_redis):
    """One server: ``start`` and ``finish`` ask and give back in their own call; the pool is named among the pools
    (``POOLS``) all the same, so that ``reap_pools`` returns a dead worker's slot to the line (the model's drain
    found a cancelled ticket's member left in the line when it was not)."""
    one = Pool("one", limit=1, interval_ms=0)
    a, b = (gate.submit(Submission(k, _message(_task_id(k, 1)), task_id=_task_id(k, 1))).ticket for k in ("a", "b"))
    assert gate.start(Start("a", a, 1, task_id=_task_id("a", a), pool=one)).ok
    assert gate.start(Start("b", b, 1, task_id=_task_id("b", b), pool=one)).code is Code.PARKED
    # a's worker died: its run fails, and its slot's deadline passes.
    assert [r.action for r in gate.release("a", a)] == [RecoveryAction.FAIL]
    gate_redis.zadd(PoolNames("one").running, {pool_member("a", a): 1})

    assert "one" in gate.pool_names()
    assert [(r.action, r.key, r.ticket) for r in gate.reap_pools()] == [(RecoveryAction.GRANT, "b", b)]
