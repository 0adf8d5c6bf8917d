"""A worker whose broker connection was lost: it survives, and what it had received is sent again.

Two things happen in the worker's main process, installed at ``worker_init``:

- kombu's Redis transport ends the worker when the connection breaks while a
  BRPOP is pending and the worker holds unacknowledged messages (prefetched,
  not yet started): Celery's consumer closes the channel twice, the second
  time after the transport is gone, and restoring the unacknowledged
  messages then raises ``AttributeError`` (``'NoneType' object has no
  attribute 'hostname'``), which Celery treats as unrecoverable. Keyed tasks
  make that state the usual one: their grants arrive one by one on a short
  queue. ``Channel.close`` is wrapped so that a pending BRPOP whose
  connection died counts as nothing to read, as an empty one already does;
  the first close then restores, or fails to restore, as on any other
  connection loss, and the worker reconnects.

- Messages the worker had received but not started when the connection
  broke stay in kombu's unacknowledged set until its visibility timeout
  (an hour by default); a message being delivered when Redis died is gone.
  For keyed tasks those are granted tickets that never start. When the
  consumer connects again, every ticket granted before the connection was
  lost and still not started is published again at once (the worker's
  reaper does it). Whichever copy arrives first starts the ticket; the gate
  drops the others (G4).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import wraps
from queue import Empty  # what kombu's Redis channel raises on an empty read
from typing import TYPE_CHECKING, Any

from celery import bootsteps

if TYPE_CHECKING:
    from celery.worker.consumer import Consumer

logger = logging.getLogger(__name__)


def tolerate_lost_brpop_on_close() -> None:
    """Make kombu's Redis channel close cleanly when its pending BRPOP died with the connection."""
    try:
        from kombu.transport.redis import Channel
    except ImportError:  # redis-py is missing: the Redis transport is not in use
        return
    close = Channel.close
    if getattr(close, "keyed_queue_wrapped", False):
        return

    @wraps(close)
    def close_after_pending_read(self: Channel) -> None:
        # The Redis channel's own attributes below are not in kombu's stubs.
        if self._in_poll:  # type: ignore[attr-defined]
            try:
                self._brpop_read()  # type: ignore[attr-defined]  # clears _in_poll whatever happens
            except Empty:
                pass
            except self.connection_errors:  # type: ignore[attr-defined]
                # The reply died with the connection; the close goes on as after an empty read.
                logger.debug("broker connection lost with a BRPOP pending; closing the channel")
        close(self)

    close_after_pending_read.keyed_queue_wrapped = True  # type: ignore[attr-defined]
    Channel.close = close_after_pending_read  # type: ignore[method-assign]  # the patch this function makes


def republish_after_reconnect(on_reconnect: Callable[[float], None]) -> type[bootsteps.StartStopStep]:
    """A consumer bootstep calling ``on_reconnect(lost_at)``, the ``time.monotonic()`` of the loss.

    Celery stops the consumer's steps when the broker connection is lost and
    starts them again once it reconnected; the first start is the worker's
    own and is not reported.
    """

    class RepublishAfterReconnect(bootsteps.StartStopStep):
        label = "keyed queue: republish after reconnect"
        requires = ("celery.worker.consumer.tasks:Tasks",)

        def __init__(self, consumer: Consumer, **kwargs: Any) -> None:
            super().__init__(consumer, **kwargs)
            self.lost_at: float | None = None

        def start(self, consumer: Consumer) -> None:
            if self.lost_at is not None:
                lost_at, self.lost_at = self.lost_at, None
                logger.info(
                    "broker connection back after %.1fs: keyed tasks granted before it was lost and not "
                    "started are published again",
                    time.monotonic() - lost_at,
                )
                on_reconnect(lost_at)

        def stop(self, consumer: Consumer) -> None:
            self.lost_at = time.monotonic()

        def shutdown(self, consumer: Consumer) -> None:
            self.lost_at = None

    return RepublishAfterReconnect
