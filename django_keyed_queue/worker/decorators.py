"""``@keyed_serial_task``: a real Celery task (via ``shared_task``) run serially per key."""

from __future__ import annotations

import inspect
import string
from collections.abc import Callable
from typing import Any

from celery import shared_task

from ..exceptions import InvalidKey
from .task import KeyedSerialTask


def keyed_serial_task(*, key: str | Callable[..., str], limit: int = 1, **options: Any) -> Callable:
    """Make ``fun`` a Celery task whose runs sharing ``key`` are serialized.

    ``key`` is a ``str.format`` template over the task's arguments
    (``"account:{account_id}"``) or a callable taking the task's arguments.
    At most ``limit`` tasks of one key run at once. Other options go to
    ``shared_task`` unchanged (``bind``, ``max_retries``, ``queue`` ...).
    """
    if not (isinstance(key, str) or callable(key)):
        raise InvalidKey(f"key must be a format string or a callable, got {type(key).__name__}")
    if isinstance(key, str) and not key:
        raise InvalidKey("key must not be empty")
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise ValueError(f"limit must be an int >= 1, got {limit!r}")
    base = options.pop("base", KeyedSerialTask)
    if not (isinstance(base, type) and issubclass(base, KeyedSerialTask)):
        raise TypeError(f"base must be a subclass of KeyedSerialTask, got {base!r}")

    def decorate(fun: Callable) -> Any:
        if isinstance(key, str):
            _check_template(fun, key, bound=options.get("bind", False))
        serial_key = key if isinstance(key, str) else staticmethod(key)
        return shared_task(base=base, serial_key=serial_key, serial_limit=limit, **options)(fun)

    return decorate


def _check_template(fun: Callable, template: str, *, bound: bool) -> None:
    """Refuse, at import time, a template naming an argument the function does not take."""
    params = list(inspect.signature(fun).parameters.values())[1 if bound else 0 :]
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return
    names = {p.name for p in params}
    try:
        fields = [field for _, field, _, _ in string.Formatter().parse(template) if field is not None]
    except ValueError as exc:
        raise InvalidKey(f"{fun.__qualname__}: bad key template {template!r}: {exc}") from exc
    for field in fields:
        root = field.split(".", 1)[0].split("[", 1)[0]
        if not root or root.isdigit():
            raise InvalidKey(f"{fun.__qualname__}: key template {template!r} must name arguments, not positions")
        if root not in names:
            raise InvalidKey(
                f"{fun.__qualname__}: key template {template!r} names {root!r}, "
                f"which is not an argument of the task ({', '.join(sorted(names)) or 'none'})"
            )
