"""The memory a worker's main process shares with its child processes (``worker.handoff_runs``): the task
ids Celery revoked there reach a child process forked before the revoke, so a kept grant of one never runs."""

import os

import pytest

from django_keyed_queue.worker import handoff_runs


@pytest.fixture
def shared():
    handoff_runs.share(2)
    yield
    handoff_runs._memory = handoff_runs._revoked = handoff_runs._task_events = handoff_runs._counts = None


def in_a_forked_child(check) -> int:
    """Run ``check`` in a child forked now; its exit code (0: it held)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        os._exit(0 if check() else 1)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_a_child_process_sees_the_ids_revoked_after_it_was_forked(shared):
    read, write = os.pipe()

    def child() -> bool:
        os.read(read, 1)  # until the main process revoked
        return handoff_runs.revoked("b") and handoff_runs.revoked("c") and not handoff_runs.revoked("a")

    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        os._exit(0 if child() else 1)
    assert not handoff_runs.revoked("b")
    handoff_runs.revoke(["b", "c"])
    os.write(write, b"x")
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


def test_an_id_matches_whole_and_the_latest_slots_are_kept(shared):
    handoff_runs.revoke(["task-12"])
    assert handoff_runs.revoked("task-12")
    assert not handoff_runs.revoked("task-1") and not handoff_runs.revoked("ask-12"), "a part of an id is no match"
    handoff_runs.revoke(f"later-{n}" for n in range(handoff_runs.REVOKED_SLOTS))
    assert not handoff_runs.revoked("task-12"), "the oldest gave its slot to a later one"
    assert handoff_runs.revoked("later-0") and handoff_runs.revoked(f"later-{handoff_runs.REVOKED_SLOTS - 1}")


def test_an_id_too_long_to_share_is_told_and_the_others_are_shared(shared, caplog):
    handoff_runs.revoke(["x" * handoff_runs.REVOKED_BYTES, "short", "ünïcode\0id"])
    assert handoff_runs.revoked("short") and handoff_runs.revoked("ünïcode\0id")
    assert "too long for the child processes" in caplog.text


def test_without_a_worker_nothing_is_revoked():
    assert handoff_runs._revoked is None
    handoff_runs.revoke(["a"])
    assert not handoff_runs.revoked("a")
    assert in_a_forked_child(lambda: not handoff_runs.revoked("a")) == 0


def test_runs_handed_off_are_counted_per_task_name_across_processes(shared):
    class Index:  # billiard's child process has an index; the tests' process has none
        def __init__(self, index: int) -> None:
            self.index, self.pid = index, os.getpid()

    from django_keyed_queue.worker import handoff_runs as runs

    def count_in(index: int, names: list[str]) -> bool:
        runs.forget_counted()
        original = runs.current_process
        runs.current_process = lambda: Index(index)
        try:
            for name in names:
                runs.count_run(name)
        finally:
            runs.current_process = original
        return True

    assert in_a_forked_child(lambda: count_in(0, ["a", "a", "b"])) == 0
    assert in_a_forked_child(lambda: count_in(1, ["a"])) == 0
    assert in_a_forked_child(lambda: count_in(0, ["b"])) == 0, "a process taking a gone one's index goes on"
    assert handoff_runs.handed_off_totals() == {"a": 3, "b": 2}
