"""Which queues Celery's running workers consume, as Celery's own inspection answers (a broadcast), cached.

A task granted a while ago and not started may wait for a worker that consumes its queue and no
longer runs: the explanation of its wait asks here. One broadcast at most every ``CACHE_SECONDS``
per cache (Django's), answered within ``TIMEOUT_SECONDS``; the replies are the workers' own, read
as data only.
"""

from __future__ import annotations

import logging
from datetime import datetime

from celery import current_app
from django.core.cache import cache
from django.utils import timezone

from ...exceptions import MessageRefused
from ...messaging.message import TaskMessage
from ...records.models import KeyedTask
from ..display import at, since

logger = logging.getLogger(__name__)

CACHE_KEY = "keyed_queue:consumed_queues"
CACHE_SECONDS = 15
TIMEOUT_SECONDS = 1.0
#: A granted task not started after this long is checked against the workers' queues.
ASK_AFTER_SECONDS = 10.0


def consumed_queues() -> tuple[datetime, dict[str, list[str]]] | None:
    """When the workers were asked, and each queue a running worker consumes with the workers consuming it;
    None if the broadcast could not be made (the explanation then says nothing of it)."""
    cached = cache.get(CACHE_KEY)
    if cached is not None:
        return cached
    try:
        replies = current_app.control.inspect(timeout=TIMEOUT_SECONDS).active_queues() or {}
    except Exception as exc:  # the broker away: an explanation is still given, without this
        logger.info("keyed queue: Celery's inspect of the workers' queues failed: %r", exc)
        return None
    queues: dict[str, list[str]] = {}
    for worker, consumed in replies.items() if isinstance(replies, dict) else []:
        for queue in consumed if isinstance(consumed, list) else []:
            name = queue.get("name") if isinstance(queue, dict) else None
            if isinstance(name, str) and isinstance(worker, str):
                queues.setdefault(name, []).append(worker)
    answer = (timezone.now(), queues)
    cache.set(CACHE_KEY, answer, CACHE_SECONDS)
    return answer


def unconsumed(task: KeyedTask, dispatched: datetime | None) -> list[str]:
    """Why a task granted over ``ASK_AFTER_SECONDS`` ago has not started, if no running worker consumes its
    queue; nothing when one does, or when its queue is not known."""
    if dispatched is None or (timezone.now() - dispatched).total_seconds() < ASK_AFTER_SECONDS:
        return []
    queue = task_queue(task)
    if queue is None:
        return []
    consumed = consumed_queues()
    if consumed is None:
        return []
    asked, queues = consumed
    if queue in queues:
        return []
    when = f"Celery's inspect at {at(asked)}, {since(asked)} ago"
    if not queues:
        return [f"no worker answered Celery's inspect within {TIMEOUT_SECONDS:g} s ({when}): none may be running "
                f"to consume its queue {queue!r}"]  # fmt: skip
    return [f"no running worker consumes its queue {queue!r} ({when}): start one with -Q {queue}"]


def task_queue(task: KeyedTask) -> str | None:
    """The queue a task's stored message goes to, as Celery built it; None if it does not say."""
    try:
        sent = TaskMessage.decode(task.message.encode(), current_app.conf.accept_content).sent or {}
    except (MessageRefused, AttributeError):
        return None
    declare, routing_key = sent.get("declare"), sent.get("routing_key")
    if isinstance(declare, list) and declare and isinstance(declare[0], str):
        return declare[0]
    return routing_key if isinstance(routing_key, str) and routing_key else None
