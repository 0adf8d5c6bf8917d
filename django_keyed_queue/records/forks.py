"""A fork and the other threads' database connections. Celery's prefork worker forks its child processes
from its main process, whose own threads use the database (the recorder, the submissions' writer, the
worker's reaper, the watcher of killed runs). A fork copies the state of the database's client library
as those threads left it:

- in the middle of a call: a child forked while another thread was inside a SQLite write transaction
  can never write (that lock's record is copied into it, where nobody holds it to let it go); one forked
  while another thread opened or closed a SQLite connection hangs on its first query (a mutex copied
  locked). Each such thread's pass, its connection's closing included, and every write of the records
  hold :func:`held_off`, and a fork waits until no other thread is inside it.
- between calls: a SQLite connection another thread keeps open is copied into the child, where its
  thread is gone; the child's own connections to the file share its record of the file's locks, and so
  never take the WAL's shared lock a reader of the file must hold. Once the parent's connections had all
  closed, its next one rebuilt the WAL's index under the live child, and the child's writes were lost.
  The child closes every SQLite connection the other threads had open (the forking thread's own are
  Celery's to close: it does, in each child process).
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created

logger = logging.getLogger(__name__)

#: How long a fork waits for the writes under way; past it, it forks and says so (a write that long
#: waits for a lock itself, and a fork is never held up for good).
FORK_WAIT_SECONDS = 30.0

_state = threading.Condition()
_users: dict[int, int] = {}  # thread id -> uses it is inside
#: The SQLite connections of this process -> the thread that opened them.
_opened: weakref.WeakKeyDictionary[BaseDatabaseWrapper, int] = weakref.WeakKeyDictionary()


@contextmanager
def held_off() -> Iterator[None]:
    """Hold off forks of this process while the block runs (a use of the database by this thread)."""
    me = threading.get_ident()
    with _state:  # a fork under way holds it: the write starts after
        _users[me] = _users.get(me, 0) + 1
    try:
        yield
    finally:
        with _state:
            if _users[me] == 1:
                del _users[me]
            else:
                _users[me] -= 1
            _state.notify_all()


def _remember_opened(sender: object, connection: BaseDatabaseWrapper, **kwargs: object) -> None:
    if connection.vendor == "sqlite":
        with _state:
            _opened[connection] = threading.get_ident()


def _before_fork() -> None:
    _state.acquire()
    me = threading.get_ident()
    if not _state.wait_for(lambda: not (_users.keys() - {me}), timeout=FORK_WAIT_SECONDS):
        logger.warning("keyed queue: forking while another thread uses the database (waited %.0f s)", FORK_WAIT_SECONDS)


def _after_fork_in_parent() -> None:
    _state.release()


def _after_fork_in_child() -> None:
    # The child's only thread is the one that forked: the others' uses are not its own.
    global _state, _users
    _state = threading.Condition()
    me = threading.get_ident()
    _users = {user: n for user, n in _users.items() if user == me}
    for wrapper, opener in list(_opened.items()):
        if opener != me and wrapper.connection is not None:
            try:
                wrapper.connection.close()  # the copy's: the parent's own stays open
            except Exception:
                pass
            wrapper.connection = None


connection_created.connect(_remember_opened, dispatch_uid="django_keyed_queue.records.forks")


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)
