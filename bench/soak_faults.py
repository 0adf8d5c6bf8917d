"""The crash soak's faults, one function per kind: each takes the ``Soak``, the round's tasks and the history
index where the round starts, injects its fault and returns what it hit.

``INJECT`` maps each name of ``soak_checks.FAULTS`` to its function.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from testproject.servers import AOF_ALWAYS

from .soak_checks import FAULTS, TIMINGS, Task

if TYPE_CHECKING:
    import redis

    from .harness import Cluster


class Soak(Protocol):
    """What a fault uses of the soak (``soak.Soak``), which imports the faults: its servers, its workers
    and the history read so far."""

    cluster: Cluster
    broker: redis.Redis
    rng: random.Random
    events: list[dict]
    live: list

    def start_worker(self) -> None: ...
    def owner(self, pid: int) -> Any: ...
    def stop(self, pids: list[int]) -> None: ...
    def resume(self, pids: list[int] | None = None) -> None: ...
    def refresh(self) -> list[dict]: ...
    def running(self, tasks: dict[tuple, Task], start: int) -> list: ...
    def pick_victim(self, tasks: dict[tuple, Task], start: int, timeout: float = 10.0) -> Any: ...
    def unreaped(self, key: str) -> str: ...
    def resume_consumers(self) -> None: ...


QUEUE = "celery"  # the broker list the workers consume: lost-message deletes granted messages from it


@dataclass(frozen=True)
class Victim:
    key: str
    n: int
    description: str
    pid: int = 0  # the process a kill or stall hit


@dataclass
class Fault:
    kind: str
    t: float = 0.0  # time.time() of the fault
    back: float = 0.0  # redis-restart: time.time() when Redis answered again
    index: int = 0  # history length at the fault: later events happened after it
    #: The runs a kill or stall hit, or the tasks whose message was deleted.
    victims: list[Victim] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    recoveries: list[float] = field(default_factory=list)
    #: Stalled runs that still held their key when they ended (the reaper had not acted yet).
    unfenced: int = 0


def kill_pool(soak: Soak, tasks: dict[tuple, Task], start: int) -> Fault:
    fault = Fault("kill-pool")
    victim = soak.pick_victim(tasks, start)
    if victim is None:
        fault.notes.append("no lingering task was running: nothing killed")
        return fault
    worker = soak.owner(victim.pid)
    fault.index, fault.t = len(soak.refresh()), time.time()
    os.kill(victim.pid, signal.SIGKILL)
    fault.victims.append(
        Victim(victim.key, victim.n, f"{victim.label} on {worker.name if worker else '?'}", victim.pid)
    )
    return fault


def kill_worker(soak: Soak, tasks: dict[tuple, Task], start: int) -> Fault:
    fault = Fault("kill-worker")
    victim = soak.pick_victim(tasks, start)
    if victim is None:
        fault.notes.append("no lingering task was running: nothing killed")
        return fault
    worker = soak.owner(victim.pid)
    if worker is None:
        fault.notes.append("the victim's worker went away: nothing killed")
        return fault
    hit = [r for r in soak.running(tasks, start) if soak.owner(r.pid) is worker]
    fault.index, fault.t = len(soak.events), time.time()
    os.killpg(worker.process.pid, signal.SIGKILL)
    worker.process.wait(10)
    soak.live.remove(worker)
    fault.victims += [Victim(r.key, r.n, f"{r.label} on {worker.name}", r.pid) for r in hit]
    began = time.monotonic()
    soak.start_worker()
    fault.notes.append(f"replacement {soak.live[-1].name} ready in {time.monotonic() - began:.1f} s")
    return fault


def stall(soak: Soak, tasks: dict[tuple, Task], start: int) -> Fault:
    fault = Fault("stall")
    victim = soak.pick_victim(tasks, start)
    if victim is None:
        fault.notes.append("no lingering task was running: nothing stalled")
        return fault
    worker = soak.owner(victim.pid)
    pause = soak.rng.uniform(TIMINGS["LEASE_SECONDS"] + 0.5, TIMINGS["LEASE_SECONDS"] + 2.5)
    fault.index, fault.t = len(soak.refresh()), time.time()
    soak.stop([victim.pid])
    try:
        time.sleep(pause)
        unreaped = soak.unreaped(victim.key)
    finally:
        soak.resume([victim.pid])
    fault.victims.append(
        Victim(victim.key, victim.n, f"{victim.label} on {worker.name if worker else '?'}", victim.pid)
    )
    fault.notes += [f"stopped {pause:.1f} s"] + ([f"at SIGCONT {unreaped}"] if unreaped else [])
    return fault


def lost_message(soak: Soak, tasks: dict[tuple, Task], start: int) -> Fault:
    """Delete 1-3 of the round's granted messages from the broker queue, then let the consumers go on.

    The consumers were paused before the round was submitted (see run_round), so its first granted
    messages are still in the queue. LREM removes a message only if no worker took it meanwhile.
    """
    fault = Fault("lost-message")
    by_id = {t.task_id: t for t in tasks.values()}
    try:
        queued: list = []
        deadline = time.monotonic() + 2.0
        while not queued and time.monotonic() < deadline:
            for raw in soak.broker.lrange(QUEUE, 0, -1):
                headers = json.loads(raw).get("headers") or {}
                if headers.get("id") in by_id and "keyed_queue" in headers:
                    queued.append((raw, headers["keyed_queue"], by_id[headers["id"]]))
        queued.sort(key=lambda q: (q[2].key, q[2].n))
        chosen = soak.rng.sample(queued, soak.rng.randint(1, min(3, len(queued)))) if queued else []
        fault.index, fault.t = len(soak.refresh()), time.time()
        for raw, header, task in chosen:
            if soak.broker.lrem(QUEUE, 1, raw):
                where = f"ticket {header['ticket']} dispatch {header['dispatch']}"
                fault.victims.append(Victim(task.key, task.n, f"{task.key}#{task.n} {where}"))
    finally:
        soak.resume_consumers()
    fault.notes.append(f"{len(queued)} granted messages were queued, {len(fault.victims)} deleted")
    return fault


def redis_restart(soak: Soak, tasks: dict[tuple, Task], start: int) -> Fault:
    """SIGKILL the one redis-server (broker, gate, history), wait 1 s, start it again on its port and dir.

    The victims are the keys with tasks not yet started at the kill: each must start again.
    """
    fault = Fault("redis-restart")
    server = soak.cluster.servers[0]
    events = soak.refresh()
    started = {(e["key"], e["n"]) for e in events[start:] if e["event"] == "start"}
    waiting = sorted(t for t in tasks if t not in started)
    fault.index, fault.t = len(events), time.time()
    server.process.kill()
    server.process.wait(10)
    time.sleep(1.0)
    server.start(*AOF_ALWAYS)
    fault.back = time.time()
    for key in sorted({k for k, _ in waiting}):
        n = min(n for k, n in waiting if k == key)
        fault.victims.append(Victim(key, n, f"{key}#{n}"))
    fault.notes.append(f"down {fault.back - fault.t:.1f} s; {len(waiting)} tasks of {len(fault.victims)} keys waiting")
    return fault


INJECT: dict[str, Callable[[Soak, dict[tuple, Task], int], Fault]] = {
    "kill-pool": kill_pool,
    "kill-worker": kill_worker,
    "stall": stall,
    "lost-message": lost_message,
    "redis-restart": redis_restart,
}
if set(INJECT) != set(FAULTS):  # a fault --faults accepts must have an injector
    raise ImportError(f"soak faults {sorted(FAULTS)} and injectors {sorted(INJECT)} differ")
