"""No fork inside a write: a process forked while another thread of its parent is inside a SQLite write
transaction can never write (SQLite's record of that lock is copied into the child, where nobody holds it
to let it go). Celery's prefork worker forks its pool processes from its main process, whose own threads
write records (the recorder, the worker's reaper, the watcher of killed runs): each such write holds
:func:`writing`, and a fork waits until no other thread is inside one.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

logger = logging.getLogger(__name__)

#: How long a fork waits for the writes under way; past it, it forks and says so (a write that long
#: waits for a lock itself, and a fork is never held up for good).
FORK_WAIT_SECONDS = 30.0

_state = threading.Condition()
_writers: dict[int, int] = {}  # thread id -> writes it is inside


@contextmanager
def writing() -> Iterator[None]:
    """Hold off forks of this process while the block runs (a SQLite write transaction)."""
    me = threading.get_ident()
    with _state:  # a fork under way holds it: the write starts after
        _writers[me] = _writers.get(me, 0) + 1
    try:
        yield
    finally:
        with _state:
            if _writers[me] == 1:
                del _writers[me]
            else:
                _writers[me] -= 1
            _state.notify_all()


def _before_fork() -> None:
    _state.acquire()
    me = threading.get_ident()
    if not _state.wait_for(lambda: not (_writers.keys() - {me}), timeout=FORK_WAIT_SECONDS):
        logger.warning("keyed queue: forking while another thread writes records (waited %.0f s)", FORK_WAIT_SECONDS)


def _after_fork_in_parent() -> None:
    _state.release()


def _after_fork_in_child() -> None:
    # The child's only thread is the one that forked: the others' writes are not its own.
    global _state, _writers
    _state = threading.Condition()
    _writers = {me: n for me, n in _writers.items() if me == threading.get_ident()}


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)
