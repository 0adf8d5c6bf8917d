"""``KEYED_QUEUE_POOLS``: the named pools a task may join, as the settings give them now.

``{"payments": {"limit": 10, "rate": "20/s"}, "mail": {"rate": "5/s"}}``: at most ``limit`` tasks of
the pool run at once and at most ``rate`` start, across every worker process and host, whatever
their keys (``gate/pools.py`` says how). A pool has a limit, a rate, or both.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured

from .conf import settings
from .gate import Pool
from .rates import rate_interval_ms

#: What a pool's entry may say.
POOL_FIELDS = ("limit", "rate")
#: Longest pool name, in characters.
MAX_POOL_NAME = 200


#: The setting last read, and the pools it gave: every pooled start asks, and the setting rarely changes.
_read: tuple[object, dict[str, Pool]] | None = None


def configured_pools() -> dict[str, Pool]:
    """The pools ``KEYED_QUEUE_POOLS`` names, as the gate takes them; ImproperlyConfigured naming what is wrong.
    Read again whenever the setting is another object (``override_settings`` gives one)."""
    global _read
    pools = settings.POOLS
    if _read is not None and _read[0] is pools:
        return dict(_read[1])
    if not isinstance(pools, dict):
        raise ImproperlyConfigured(f"KEYED_QUEUE_POOLS must be a dict of pool name -> options, got {pools!r:.80}")
    parsed = {name: _pool(name, options) for name, options in pools.items()}
    _read = (pools, parsed)
    return dict(parsed)


def _pool(name: Any, options: Any) -> Pool:
    if not isinstance(name, str) or not name or len(name) > MAX_POOL_NAME or "\0" in name:
        raise ImproperlyConfigured(
            f"KEYED_QUEUE_POOLS: a pool's name must be a text of 1 to {MAX_POOL_NAME} characters, no NUL; "
            f"got {name!r:.80}"
        )
    where = f"KEYED_QUEUE_POOLS[{name!r}]"
    if not isinstance(options, dict) or not options:
        raise ImproperlyConfigured(f'{where} must be a dict with a "limit", a "rate" or both, got {options!r:.80}')
    unknown = sorted(repr(k) for k in options if k not in POOL_FIELDS)
    if unknown:
        raise ImproperlyConfigured(f'{where}: unknown option {", ".join(unknown)}; a pool takes "limit" and "rate"')
    limit = options.get("limit")
    if limit is not None and not (isinstance(limit, int) and not isinstance(limit, bool) and limit >= 1):
        raise ImproperlyConfigured(f'{where}["limit"] must be a whole number >= 1, got {limit!r:.80}')
    try:
        interval_ms = rate_interval_ms(options.get("rate"))
    except ValueError as exc:
        raise ImproperlyConfigured(f'{where}["rate"]: {exc}') from None
    if not (limit or interval_ms):
        raise ImproperlyConfigured(f'{where} must give a "limit", a "rate" or both, got {options!r:.80}')
    return Pool(name, limit=limit or 0, interval_ms=interval_ms)


def pool_of(task: Any) -> Pool | None:
    """The pool a task joins (its ``serial_pool``, as the settings give it now), or None."""
    name = getattr(task, "serial_pool", None)
    if name is None:
        return None
    pool = configured_pools().get(name)
    if pool is None:
        raise ImproperlyConfigured(unknown_pool(getattr(task, "name", "a task"), name))
    return pool


def unknown_pool(task_name: str, name: str) -> str:
    known = ", ".join(map(repr, sorted(configured_pools()))) or "none"
    return f"{task_name} names pool {name!r}, which KEYED_QUEUE_POOLS lacks (it has: {known})"
