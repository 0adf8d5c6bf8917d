"""Real concurrency on one key: threads and spawned processes, each with its own Redis connection."""

from __future__ import annotations

import multiprocessing
import threading
from collections import Counter, defaultdict

import redis

from django_keyed_queue.gate import Cancel, Code, Finish, Gate, Grant, Start, Submission
from django_keyed_queue.gate.clients import close
from django_keyed_queue.gate.keys import KeyNames
from tests.gate_redis import connect_to
from tests.waiting import wait_until

from . import _race_workers as rw

SPAWN = multiprocessing.get_context("spawn")


class Crew:
    """Threads and spawned processes running one function of _race_workers; checked on exit."""

    def __init__(self, client: redis.Redis, target, threads: int, processes: int, args) -> None:
        self.client = client
        self.size = threads + processes
        self.threads = [threading.Thread(target=target, args=(*args(f"t{i}"),), daemon=True) for i in range(threads)]
        self.processes = [SPAWN.Process(target=target, args=(*args(f"p{i}"),), daemon=True) for i in range(processes)]

    def __enter__(self) -> Crew:
        for runner in [*self.processes, *self.threads]:
            runner.start()
        wait_until(lambda: self.client.llen(rw.READY) == self.size, timeout=30, message="every runner to be ready")
        return self

    def __exit__(self, *exc_info) -> None:
        for thread in self.threads:
            thread.join(20)
        for process in self.processes:
            process.join(20)
            if process.is_alive():
                process.kill()
        errors = [e.decode() for e in self.client.lrange(rw.ERRORS, 0, -1)]
        assert not errors, "\n".join(errors)
        assert not any(t.is_alive() for t in self.threads), "a thread did not finish"
        assert [p.exitcode for p in self.processes] == [0] * len(self.processes)


def test_concurrent_submits_take_unique_contiguous_tickets(gate, gate_redis, redis_url):
    per_runner, threads, processes, limit = 30, 6, 3, 3
    total = per_runner * (threads + processes)

    with Crew(gate_redis, rw.submitter, threads, processes, lambda name: (redis_url, "hot", name, per_runner, limit)):
        gate_redis.rpush(rw.GO, *["go"] * (threads + processes))

    rows = [row.decode().split("|") for row in gate_redis.lrange(rw.SUBMITTED, 0, -1)]
    assert len(rows) == total
    tickets = sorted(int(ticket) for ticket, _, _ in rows)
    assert tickets == list(range(1, total + 1)), "tickets must be unique and contiguous"
    granted = sorted(int(ticket) for ticket, was_granted, _ in rows if was_granted == "1")
    assert granted == [1, 2, 3], f"exactly the first {limit} tickets are granted"

    by_runner: dict[str, list[int]] = defaultdict(list)
    for ticket, _, message in rows:
        assert gate_redis.hget(KeyNames("hot").messages, ticket) == message.encode()
        by_runner[message.split("/")[0]].append(int(ticket))
    assert all(t == sorted(t) for t in by_runner.values()), "one runner's submissions keep their order"
    state = gate.inspect("hot")
    assert sorted(state.holders) == [1, 2, 3]
    assert state.waiting == list(range(4, total + 1))
    assert (state.last_ticket, state.messages) == (total, total)


def _run_pool(gate: Gate, client: redis.Redis, url: str, limit: int, total: int, work_seconds: float) -> list[list]:
    threads, processes = 4, 2
    stops = threads + processes

    def args(name: str) -> tuple:
        return (url, "pool", name, limit, total, stops, work_seconds)

    with Crew(client, rw.worker, threads, processes, args):
        for n in range(total):
            submitted = gate.submit(Submission("pool", f"task {n}".encode(), limit=limit))
            if submitted.granted:
                rw.publish(client, [Grant("pool", submitted.ticket, 1, b"")])
    state = gate.inspect("pool")
    assert state.holders == {} and state.waiting == [] and state.messages == 0
    return [line.decode().split() for line in client.lrange(rw.LOG, 0, -1)]


def _check_log(log: list[list], limit: int, total: int) -> tuple[list[int], int]:
    """Replay the log: returns the first-start order and the most tickets seen running at once."""
    running: set[int] = set()
    most = 0
    first_starts: list[int] = []
    for event, ticket, *_ in log:
        ticket = int(ticket)
        if event == "start":
            assert ticket not in running
            running.add(ticket)
            most = max(most, len(running))
            assert most <= limit, f"{sorted(running)} ran at once with limit {limit}"
            if ticket not in first_starts:
                first_starts.append(ticket)
        elif event in ("end", "retry"):
            running.remove(ticket)
    starts = Counter(int(t) for event, t, *_ in log if event == "start")
    retried = [t for t in range(1, total + 1) if t % 5 == 0]
    assert starts == Counter({t: 2 if t in retried else 1 for t in range(1, total + 1)}), "one start per attempt"
    ends = [int(t) for event, t, *_ in log if event == "end"]
    assert sorted(ends) == list(range(1, total + 1))
    # Every duplicate delivery was dropped by the gate, with a reason it gives for duplicates.
    drops = Counter(reason for event, _, _, reason in (e for e in log if e[0] == "drop"))
    assert set(drops) <= {"ALREADY_STARTED", "NOT_GRANTED", "STALE_DISPATCH"}
    assert sum(drops.values()) == total + len(retried)
    assert drops["STALE_DISPATCH"] + drops["NOT_GRANTED"] >= 1
    return first_starts, most


def test_pool_with_limit_one_runs_one_at_a_time_in_ticket_order(gate, gate_redis, redis_url):
    total = 40
    log = _run_pool(gate, gate_redis, redis_url, limit=1, total=total, work_seconds=0.002)

    first_starts, most = _check_log(log, limit=1, total=total)

    assert most == 1
    assert first_starts == list(range(1, total + 1))
    # A retry keeps the key: the retried ticket runs again before any later ticket starts.
    starts = [int(t) for event, t, *_ in log if event == "start"]
    expected = [t for n in range(1, total + 1) for t in ([n, n] if n % 5 == 0 else [n])]
    assert starts == expected


def test_pool_with_limit_three_runs_at_most_three_at_once(gate, gate_redis, redis_url):
    total = 45
    log = _run_pool(gate, gate_redis, redis_url, limit=3, total=total, work_seconds=0.02)

    _, most = _check_log(log, limit=3, total=total)

    assert most >= 2, "with six workers and 20 ms tasks, slots must have been shared"


def test_duplicate_starts_of_one_ticket_start_it_once(gate, redis_url):
    racers, rounds = 12, 10
    for n in range(rounds):
        gate.submit(Submission("dup", f"m{n}".encode(), task_id=f"t{n}"))  # remembered: the drained key's counters stay
    results: dict[int, list] = defaultdict(list)
    lock = threading.Lock()
    current = {"ticket": 1}

    def finish_round() -> None:  # run by one thread once every racer has started its round
        (winner,) = [r for r in results[current["ticket"]] if r.ok]
        gate.finish(Finish("dup", current["ticket"], winner.token))
        current["ticket"] += 1

    barrier = threading.Barrier(racers, action=finish_round, timeout=10)
    errors: list[BaseException] = []

    def racer() -> None:
        client = connect_to(redis_url)
        try:
            mine = rw.make_gate(client)
            for _ in range(rounds):
                ticket = current["ticket"]
                result = mine.start(Start("dup", ticket, 1))
                with lock:
                    results[ticket].append(result)
                barrier.wait()
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
            barrier.abort()
        finally:
            close(client)  # a cluster client's node pools too

    threads = [threading.Thread(target=racer) for _ in range(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)

    assert not errors, errors
    assert sorted(results) == list(range(1, rounds + 1))
    for ticket, outcomes in results.items():
        codes = Counter(r.code for r in outcomes)
        assert codes == Counter({Code.OK: 1, Code.ALREADY_STARTED: racers - 1}), (ticket, codes)
    tokens = sorted(r.token for outcomes in results.values() for r in outcomes if r.code is Code.OK)
    assert tokens == list(range(tokens[0], tokens[0] + rounds)), "one fencing token per ticket, none for the losers"
    assert gate.inspect("dup").last_token == tokens[-1]


def test_cancel_racing_start_lets_exactly_one_win(gate, redis_url):
    rounds = 40
    outcomes = Counter()
    for _ in range(rounds):
        ticket = gate.submit(Submission("race", b"m")).ticket
        barrier = threading.Barrier(2, timeout=10)
        got: dict[str, object] = {}

        def call(name, fn, ticket=ticket, barrier=barrier, got=got):
            client = connect_to(redis_url)
            try:
                mine = rw.make_gate(client)
                barrier.wait()
                got[name] = fn(mine, ticket)
            finally:
                close(client)  # a cluster client's node pools too

        runners = [
            threading.Thread(target=call, args=("start", lambda g, t: g.start(Start("race", t, 1)))),
            threading.Thread(target=call, args=("cancel", lambda g, t: g.cancel(Cancel("race", t)))),
        ]
        for runner in runners:
            runner.start()
        for runner in runners:
            runner.join(10)
        pair = (got["start"].code, got["cancel"].code)
        assert pair in {(Code.OK, Code.RUNNING), (Code.NOT_GRANTED, Code.OK)}, pair
        outcomes[pair] += 1
        if got["start"].ok:
            assert gate.finish(Finish("race", ticket, got["start"].token)).ok
        state = gate.inspect("race")
        assert state.holders == {} and state.messages == 0
    assert sum(outcomes.values()) == rounds
