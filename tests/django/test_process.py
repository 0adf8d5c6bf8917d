"""One object per process: its own after a fork, and its lease keeper's renewals beat on the record."""

import os
import threading
import time
import warnings
from datetime import timedelta

import pytest
from django.utils import timezone

from django_keyed_queue.gate import Finish, Lease, Start, Submission
from django_keyed_queue.process import state as process
from django_keyed_queue.process.leases import LeaseKeeper
from django_keyed_queue.records.models import KeyedTask
from django_keyed_queue.records.recorder import Recorder


def _wait_for_child(pid: int, timeout: float) -> int | None:
    """The child's exit code, or None if it is still running after ``timeout`` (then it is killed)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return None


def test_a_process_forked_while_another_thread_holds_the_lock_makes_its_own_state():
    """A child process forked while the worker's reaper thread was making the gate must not hang."""
    parent = process.current()
    held, release = threading.Event(), threading.Event()

    def hold_the_lock() -> None:
        with process._lock:
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold_the_lock)
    holder.start()
    assert held.wait(5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # Python 3.12+: fork() of a threaded process
        pid = os.fork()
    if pid == 0:  # the child: exit at once, whatever happens, never back into pytest
        code = 3
        try:
            child = process.current()
            code = 0 if child is not parent and child.pid == os.getpid() and child.gate is not parent.gate else 1
        finally:
            os._exit(code)
    try:
        code = _wait_for_child(pid, timeout=10)
    finally:
        release.set()
        holder.join()
    assert code == 0, "the forked child hung on its parent's lock" if code is None else f"child exit {code}"
    assert process.current() is parent


@pytest.mark.django_db
def test_each_renewal_moves_the_records_heartbeat_until_the_lease_is_lost():
    gate = process.get_gate()
    submitted = gate.submit(Submission("heartbeat", b"m", start=True, task_id="hb-1"))
    lease = Lease("heartbeat", submitted.ticket, submitted.token)
    long_ago = timezone.now() - timedelta(hours=1)
    KeyedTask.objects.create(
        task_id="hb-1", task_name="demo.step", key="heartbeat", ticket=lease.ticket, status="running",
        attempts=1, enqueued_at=long_ago, started_at=long_ago, heartbeat_at=long_ago,
    )  # fmt: skip
    recorder = Recorder()
    keeper = LeaseKeeper(lambda: gate, recorder)
    try:
        keeper.hold(lease, "hb-1", 1)
        keeper.renew_now()
        recorder.flush()
        beat = KeyedTask.objects.get(task_id="hb-1").heartbeat_at
        assert beat > long_ago + timedelta(minutes=59)

        assert gate.finish(Finish(lease.key, lease.ticket, lease.token)).ok  # another end: the lease is gone
        keeper.renew_now()
        assert keeper.is_lost(lease)
        assert recorder.peek(("hb-1", "heartbeat", lease.ticket)) is None  # a lost lease proves nothing
    finally:
        keeper.close()


class _EndsBeforePoolRenewal:
    """The gate, but the run ``lease`` ends for real (its worker's finish, its keeper told first) between
    the renewal of the leases and that of the pools' slots: a run ending while its process renews."""

    def __init__(self, gate, keeper: LeaseKeeper, lease: Lease, pool: str) -> None:
        self._gate, self._keeper, self._lease, self._pool = gate, keeper, lease, pool

    def __getattr__(self, name: str):
        return getattr(self._gate, name)

    def pool_renew(self, pool, leases):
        self._keeper.stop_renewing(self._lease)  # as Run.finish lets go before it finishes
        assert self._gate.finish(Finish(self._lease.key, self._lease.ticket, self._lease.token, pool=self._pool)).ok
        return self._gate.pool_renew(pool, leases)


@pytest.mark.django_db
def test_a_pooled_run_ending_while_its_process_renews_is_no_lost_slot_and_a_slot_taken_from_it_is(caplog):
    """A renewal finds the pool slot of a run that ended meanwhile given back: that run is no longer held,
    so nothing is lost. A slot given back under a run still held is (the pool may let another beside it)."""
    from django_keyed_queue.gate.pools import Pool

    gate, pool = process.get_gate(), Pool("roomy", limit=2, interval_ms=0)
    leases = []
    for key in ("pooled-a", "pooled-b"):
        submitted = gate.submit(Submission(key, b"m"))
        started = gate.start(Start(key, submitted.ticket, 1, pool=pool))
        assert started.ok
        leases.append(Lease(key, submitted.ticket, started.token))
    ending, held = leases
    recorder = Recorder()
    renewing = LeaseKeeper(lambda: _EndsBeforePoolRenewal(gate, renewing, ending, pool.name), recorder)
    keeper = LeaseKeeper(lambda: gate, recorder)
    try:
        for lease in leases:
            renewing.hold(lease, lease.key, 1, pool.name)
        with caplog.at_level("WARNING", logger="django_keyed_queue.process.leases"):
            renewing.renew_now()
        assert "pool slot lost" not in caplog.text, "the run ended: its slot went back with it"
        assert not renewing.is_lost(held)

        gate.pool_release(pool.name, [(held.key, held.ticket)])  # its slot, taken while it runs
        keeper.hold(held, held.key, 1, pool.name)
        with caplog.at_level("WARNING", logger="django_keyed_queue.process.leases"):
            keeper.renew_now()
        assert f"pool slot lost pool='roomy' key='pooled-b' ticket={held.ticket}" in caplog.text
    finally:
        renewing.close()
        keeper.close()
        recorder.close()
