"""An operator's limit and rate for one key, or one pool, over its tasks' own, set at runtime without a deploy.

Kept in the gate's Redis with the key (``Gate.set_overrides``) until set back to the tasks' own
(None); they apply from the key's next grant and start on, a raised limit dispatches its
waiting tasks at once, and a lowered one puts back those granted but never started (their records
say they wait again). They are not in the database: a total loss of Redis loses them, and
``keyed_queue_rebuild`` does not restore them. Each change is logged for the audit trail by the
operator's recovery logger, as the other actions are.
"""

from __future__ import annotations

import logging
from typing import cast

from celery import Celery, current_app

from ...exceptions import ActionRefused
from ...gate import UNCHANGED
from ...gate.override import Unchanged
from ...messaging.dispatch import Dispatched, publish_grants
from ...pools import configured_pools
from ...process.state import current, operator_gate
from ...rates import rate_interval_ms
from ...records import submissions
from ...records.statuses import Status
from ..display import rate_said
from . import AUDIT_LOGGER
from .lookup import operator_key

#: The operator's actions' audit trail, one logger for all of them.
logger = logging.getLogger(AUDIT_LOGGER)

#: The highest limit an operator may give a key.
MAX_KEY_LIMIT = 1_000_000
#: The word that sets a key's limit or rate back to its tasks' own, in the command and the admin.
DEFAULT = "default"
#: How the log says a limit or rate set back to its tasks' own.
DEFAULT_SAID = "of its tasks (default)"


def set_limits(
    *,
    key: str | None = None,
    pool: str | None = None,
    limit: int | None | Unchanged = UNCHANGED,
    rate: str | None | Unchanged = UNCHANGED,
    by: str = "an operator",
    app: Celery | None = None,
) -> Dispatched:
    """Give one ``key``, or one ``pool`` of ``KEYED_QUEUE_POOLS``, an operator's limit and rate over its
    tasks' own, across every worker: at most ``limit`` of its tasks run at once, at most ``rate`` start
    (``"10/s"``, ``"30/m"``, ``"100/h"``); None sets one back to its tasks' own, and one left out stays as
    it is. Both are checked before either is set. A raised limit dispatches waiting tasks now; a lowered
    one stops no run (a key's tasks granted but not started wait again). Repeating it changes nothing."""
    if (key is None) == (pool is None):
        raise TypeError(f"set_limits takes a key or a pool, not both or neither (key={key!r}, pool={pool!r})")
    whose = "a key's" if key is not None else "a pool's"
    number = limit if limit is UNCHANGED else _checked_limit(limit, whose)
    interval = rate if rate is UNCHANGED else _checked_interval(rate, whose)
    if key is not None:
        return _set(operator_key(key), number, interval, by=by, app=app)[0]
    return _set_pool(known_pool(cast(str, pool)), number, interval, by=by, app=app)


def set_typed(
    *, key: str | None = None, pool: str | None = None, limit: str, rate: str, by: str = "an operator"
) -> str:
    """The limit and rate an operator typed for a key or a pool (the command's arguments, the live keys
    page's forms): each a number, ``DEFAULT``, or "" to leave it; refused as :func:`set_limits` refuses
    them, both checked before either is set, and then set together in one gate call. What was set, said."""
    if (key is None) == (pool is None):
        raise TypeError(f"set_typed takes a key or a pool, not both or neither (key={key!r}, pool={pool!r})")
    name = operator_key(key) if key is not None else known_pool(cast(str, pool))
    number, interval = _typed(limit, rate, "a key's" if key is not None else "a pool's")
    if number is UNCHANGED and interval is UNCHANGED:
        return ""
    if key is not None:
        done, withdrawn = _set(name, number, interval, by=by)
    else:
        done, withdrawn = _set_pool(name, number, interval, by=by), 0
    back = f", {withdrawn} granted but not started wait again" if withdrawn else ""
    said = [f"limit {limit}; {done}{back}"] if limit else []
    return ", ".join([*said, *([f"rate {rate}"] if rate else [])])


def _set_pool(
    pool: str, limit: int | None | Unchanged, interval_ms: int | None | Unchanged, *, by: str, app: Celery | None = None
) -> Dispatched:
    """Set the pool's overrides in one gate call, publish the tasks a raised limit gave slots, and log it."""
    done = publish_grants(
        app or current_app, operator_gate().set_pool_overrides(pool, limit=limit, interval_ms=interval_ms)
    )
    said = [f"limit {limit or DEFAULT_SAID}"] if limit is not UNCHANGED else []
    if interval_ms is not UNCHANGED:
        said.append(f"rate {rate_said(interval_ms) if interval_ms else DEFAULT_SAID}")
    logger.info("keyed queue pool %r: %s, set by %s; %s", pool, ", ".join(said), by, done)
    return done


def known_pool(pool: str) -> str:
    """``pool`` if the settings or the gate know it, else ActionRefused naming the pools there are."""
    known = set(configured_pools()) | set(operator_gate().pool_names())
    if pool not in known:
        raise ActionRefused(f"no pool {pool!r}; the pools are: {', '.join(map(repr, sorted(known))) or 'none'}")
    return pool


def _typed(limit: str, rate: str, whose: str) -> tuple[int | None | Unchanged, int | None | Unchanged]:
    """A limit and a rate as typed (a number, ``DEFAULT``, or "" to leave it), both checked before either is set."""
    number: int | None | Unchanged = UNCHANGED
    if limit:
        whole = limit.isascii() and limit.isdigit() and len(limit) <= 18  # a number, not a 5,000-digit text
        number = _checked_limit(None if limit == DEFAULT else int(limit) if whole else limit, whose)
    interval = _checked_interval(None if rate == DEFAULT else rate, whose) if rate else UNCHANGED
    return number, interval


def _set(
    key: str, limit: int | None | Unchanged, interval_ms: int | None | Unchanged, *, by: str, app: Celery | None = None
) -> tuple[Dispatched, int]:
    """Set the key's overrides in one gate call, publish what a raised limit granted, record what a lowered
    one took back, and log it."""
    gate = operator_gate()
    overridden = gate.set_overrides(key, limit=limit, interval_ms=interval_ms)
    done = publish_grants(app or current_app, overridden.granted)
    current().recorder.flush()
    lower = f"lower limit {limit}" if isinstance(limit, int) else "limit, its tasks' own again,"
    back = f"its grant taken back by {by}'s {lower}: it waits again, its message is dropped if it arrives"
    for ticket, task_id in overridden.withdrawn:
        if task_id is not None:  # a message naming no task names no row: its ticket alone may be an older one's
            # A grant given again and started since keeps its own record.
            submissions.settle(
                gate, task_id, key, ticket, Status.WAITING, unstarted=True, dispatched_at=None, error=back
            )
    said = [f"limit {limit or DEFAULT_SAID}"] if limit is not UNCHANGED else []
    if interval_ms is not UNCHANGED:
        said.append(f"rate {rate_said(interval_ms) if interval_ms else DEFAULT_SAID}")
    logger.info("keyed queue key %r: %s, set by %s; %s; %d taken back", key, ", ".join(said), by, done,
                len(overridden.withdrawn))  # fmt: skip
    return done, len(overridden.withdrawn)


def _checked_limit(limit: object, whose: str) -> int | None:
    """``limit`` if it is one a key or pool may have (None: its tasks' own), else ActionRefused naming it."""
    if limit is None or (isinstance(limit, int) and not isinstance(limit, bool) and 1 <= limit <= MAX_KEY_LIMIT):
        return limit
    raise ActionRefused(f"{whose} limit is a whole number from 1 to {MAX_KEY_LIMIT}, or its tasks' own: {limit!r}")


def _checked_interval(rate: str | None, whose: str) -> int | None:
    """The least ms between two starts ``rate`` gives (None: its tasks' own), else ActionRefused naming it."""
    try:
        return rate_interval_ms(rate) or None
    except ValueError as exc:
        raise ActionRefused(f"{whose} {exc}") from None
