"""``@keyed_serial_task``: a real Celery task, shared as ``shared_task`` shares one, run serially per key.

Its class is built on the task class of each app that registers it: the app's
``task_cls`` (``DjangoTask`` in a Django project, whose ``delay_on_commit`` keyed
tasks keep), or the ``base=`` given, with ``KeyedSerialTask`` mixed in first.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import string
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from celery import Task, _state
from celery.local import Proxy
from django.core.exceptions import ImproperlyConfigured

from ..exceptions import InvalidKey
from ..pools import configured_pools, unknown_pool
from ..rates import rate_interval_ms
from .task import KeyedSerialTask

if TYPE_CHECKING:
    from celery import Celery


def keyed_serial_task(
    *,
    key: str | Callable[..., str],
    limit: int = 1,
    rate: str | None = None,
    on_failure: str = "continue",
    coalesce: bool | None = None,
    debounce: float | None = None,
    pool: str | None = None,
    **options: Any,
) -> Callable[[Callable[..., Any]], Any]:
    """Make ``fun`` a Celery task whose runs sharing ``key`` are serialized.

    ``key`` is a ``str.format`` template over the task's arguments
    (``"account:{account_id}"``) or a callable taking the task's arguments.
    At most ``limit`` tasks of one key run at once.

    ``rate="N/s"`` (or ``/m``, ``/h``): the starts of one key's tasks are at least
    a period / N apart, across every worker; a task early for its slot waits in
    the broker, not in a worker process. The gate spaces them in whole ms, rounded
    up, so a rate is never exceeded; above 1000/s it is refused.

    ``on_failure="block"``: a task that fails for good keeps its key held until an
    operator retries it (it runs again, first) or cancels it (``"continue"``, the
    default: the key's next task runs).

    ``coalesce=True``: a key holds at most one waiting task of this task. A newer
    submission replaces the one waiting, which never runs: its record ends
    ``superseded``, naming its replacement, its result reads ``REVOKED``, and an
    idempotency key that gave it gives the task that runs: the last of the chain of
    replacements. A running task is not touched.

    ``debounce=SECONDS`` (implies ``coalesce``): a key's task starts only once no newer
    submission of it came for that long; of a burst, only the last runs. The wait
    holds no worker process, and other keys are not delayed.

    ``pool="payments"``: the task also needs a slot of that pool, one of ``KEYED_QUEUE_POOLS``: at most its
    ``limit`` of the pool's tasks run at once, and at most its ``rate`` start, across every worker, whatever
    their keys. A task waiting for its pool holds no worker process. A pool the setting lacks raises
    ``ImproperlyConfigured`` at import.

    Other options go to ``shared_task`` unchanged (``bind``, ``max_retries``,
    ``queue`` ...), or set the task class's own (``max_recoveries``, ``idempotent``,
    ``max_waiting``, and a ``base=`` class's attributes); any other name raises
    ``TypeError`` at import.
    """
    if not (isinstance(key, str) or callable(key)):
        raise InvalidKey(f"key must be a format string or a callable, got {type(key).__name__}")
    if isinstance(key, str) and not key:
        raise InvalidKey("key must not be empty")
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise ValueError(f"limit must be an int >= 1, got {limit!r}")
    interval_ms = rate_interval_ms(rate)
    if on_failure not in FAILURE_POLICIES:
        raise ValueError(f"on_failure must be one of {', '.join(map(repr, FAILURE_POLICIES))}, got {on_failure!r}")
    if coalesce is not None and not isinstance(coalesce, bool):
        raise TypeError(f"coalesce must be True or False, got {coalesce!r}")
    debounce_ms = debounce_interval_ms(debounce)
    check_pool(pool, "@keyed_serial_task")
    if debounce_ms and coalesce is False:
        raise ValueError("debounce implies coalesce=True: of a burst only the last runs; leave coalesce out")
    base = options.pop("base", None)
    if base is not None and not (isinstance(base, type) and issubclass(base, Task)):
        raise TypeError(f"base must be a Celery task class (a subclass of celery.Task), got {base!r}")
    _check_options(options, base)

    # Any: the task, through a Proxy (celery-types' Proxy does not forward the task's attributes).
    def decorate(fun: Callable[..., Any]) -> Any:
        if isinstance(key, str):
            _check_template(fun, key, bound=options.get("bind", False))
        else:
            _check_key_function(fun, key, bound=options.get("bind", False))
        serial_key = key if isinstance(key, str) else staticmethod(key)
        ours = {
            "serial_key": serial_key,
            "serial_limit": limit,
            "serial_rate": rate,
            "serial_interval_ms": interval_ms,
            "serial_on_failure": on_failure,
            "serial_coalesce": bool(coalesce) or bool(debounce_ms),
            "serial_debounce_ms": debounce_ms,
            "serial_pool": pool,
        }
        return _shared(fun, base, {**ours, **options})

    return decorate


#: How many tasks of one pool with no key of their own may hold the key they share: the pool decides.
POOLED_KEY_LIMIT = 1_000_000


def pooled_task(*, pool: str, **options: Any) -> Callable[[Callable[..., Any]], Any]:
    """Make ``fun`` a Celery task held to a pool of ``KEYED_QUEUE_POOLS`` and to nothing else: no key of its
    own, so its runs are not serialized, but at most the pool's ``limit`` of the pool's tasks (keyed or not)
    run at once and at most its ``rate`` start, across every worker. Options as :func:`keyed_serial_task`'s
    (``bind``, ``queue``, ``max_retries`` ...), but ``key``, ``limit`` and ``rate``: the pool has them.

    Its tasks share one key, ``keyed_queue.pool:<pool>``, of a limit no pool reaches: each is granted it at
    once and waits only for its pool; the pages and commands show them under that key.
    """
    check_pool(pool, "@pooled_task")
    if pool is None:
        raise TypeError("@pooled_task: pool is required: the name of a pool of KEYED_QUEUE_POOLS")
    for own in ("key", "limit", "rate"):
        if own in options:
            raise TypeError(f"@pooled_task takes no {own}=: its pool decides (use @keyed_serial_task for a key)")
    shared_key = f"keyed_queue.pool:{pool}"

    def pool_key(*args: Any, **kwargs: Any) -> str:
        return shared_key

    pool_key.key_template = shared_key  # type: ignore[attr-defined]  # what the metrics label its tasks by
    return keyed_serial_task(key=pool_key, limit=POOLED_KEY_LIMIT, pool=pool, **options)


def _shared(fun: Callable[..., Any], base: type | None, options: dict[str, Any]) -> Any:
    """Celery's ``shared_task``, with the task's class made per app: every app, finalized or not yet
    made, registers it; the proxy returned is the current app's task."""
    if type(fun) is Proxy:
        raise TypeError("@keyed_serial_task was applied to a task; apply it to the function alone")

    def register(app: Celery) -> Task[..., Any]:
        return app._task_from_fun(fun, base=keyed_class(base or app.Task), **options)

    _state.connect_on_app_finalize(register)
    for app in _state._get_active_apps():  # type: ignore[attr-defined]  # as shared_task does; not in the stubs
        if app.finalized:
            with app._finalize_mutex:
                register(app)

    def current_task() -> Task[..., Any]:
        app = _state.get_current_app()
        return app.tasks[options.get("name") or app.gen_task_name(fun.__name__, fun.__module__)]

    return Proxy(current_task)


@functools.cache
def keyed_class(base: type) -> type:
    """``base`` (an app's task class, or a project's own) with keyed serial execution mixed in first."""
    if issubclass(base, KeyedSerialTask):
        return base
    return type(f"KeyedSerial{base.__name__}", (KeyedSerialTask, base), {"__module__": base.__module__})


def check_pool(pool: Any, where: str) -> None:
    """``pool=`` names a pool of ``KEYED_QUEUE_POOLS`` (None: no pool); else an error naming what is wrong.
    Read where the decorator runs, at import: the settings are Django's by then."""
    if pool is None:
        return
    if not isinstance(pool, str) or not pool:
        raise TypeError(f"{where}: pool must be the name of a pool of KEYED_QUEUE_POOLS, got {pool!r:.80}")
    if pool not in configured_pools():
        raise ImproperlyConfigured(unknown_pool(where, pool))


#: The longest ``debounce=``: a worker holds the message of a debounced task in memory until then.
MAX_DEBOUNCE_SECONDS = 86_400


def debounce_interval_ms(debounce: float | None) -> int:
    """``debounce=SECONDS`` in ms (0 for None), refused unless a number of seconds > 0 and at most a day."""
    if debounce is None:
        return 0
    number = isinstance(debounce, (int, float)) and not isinstance(debounce, bool)
    if not (number and 0 < debounce <= MAX_DEBOUNCE_SECONDS):
        raise ValueError(f"debounce must be a number of seconds > 0 and at most {MAX_DEBOUNCE_SECONDS}: {debounce!r}")
    return max(1, round(debounce * 1000))


#: ``on_failure=``: what a task that fails for good does to its key (see ``KeyedSerialTask.serial_on_failure``).
FAILURE_POLICIES = ("continue", "block")

#: What Celery's task decorator takes besides the task class's attributes (``Celery._task_from_fun``,
#: the autoretry options, and the routing and publishing options a task's class may set).
DECORATOR_OPTIONS = frozenset(
    (
        "bind", "name", "shared", "lazy", "filter", "run",
        "pydantic", "pydantic_strict", "pydantic_context", "pydantic_dump_kwargs",
        "autoretry_for", "dont_autoretry_for", "retry_kwargs", "retry_backoff", "retry_backoff_max", "retry_jitter",
        "queue", "routing_key", "exchange", "delivery_mode", "compression", "immediate", "mandatory",
        "store_eager_result",
    )
)  # fmt: skip


def _check_options(options: dict[str, Any], base: type | None) -> None:
    """Refuse, at import time, an option that is neither ours nor Celery's: Celery would make it
    an attribute of the task's class, and a misspelt option would silently do nothing."""
    classes = [KeyedSerialTask, base or Task]
    # The apps made so far (``get_current_app`` would make a default one): a project's ``task_cls`` may add options.
    for app in _state._get_active_apps():  # type: ignore[attr-defined]  # as shared_task does; not in the stubs
        try:
            classes.append(app.Task)
        except Exception:  # an app that cannot make its task class: its tasks fail at registration
            pass
    known = DECORATOR_OPTIONS | {name for cls in classes for name in dir(cls) if not name.startswith("_")}
    unknown = sorted(set(options) - known)
    if unknown:
        hints = []
        for name in unknown:
            close = difflib.get_close_matches(name, known, 1, 0.75)
            hints.append(f"{name!r} (did you mean {close[0]!r}?)" if close else repr(name))
        raise TypeError(
            f"@keyed_serial_task got unknown option{'s' if len(unknown) > 1 else ''} {', '.join(hints)}: "
            "neither one of its own (key, limit, rate, on_failure, coalesce, debounce, max_recoveries, idempotent, "
            "max_waiting) "
            "nor a Celery task option"
        )
    for name, value in options.items():
        if any(inspect.isfunction(getattr(cls, name, None)) for cls in classes) and not callable(value):
            raise TypeError(f"@keyed_serial_task: {name}={value!r} would replace the task's method {name}()")


def _check_template(fun: Callable[..., Any], template: str, *, bound: bool) -> None:
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


def _check_key_function(fun: Callable[..., Any], key: Callable[..., Any], *, bound: bool) -> None:
    """Refuse, at import time, a key function that cannot take the task's arguments as a call passes them
    positionally: all of them, and only the required ones."""
    try:
        takes = inspect.signature(key)
    except (TypeError, ValueError):
        return  # no signature to read (a builtin): its first submission tells
    params = list(inspect.signature(fun).parameters.values())[1 if bound else 0 :]
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
        return
    for given in (params, [p for p in params if p.default is p.empty]):
        positional = [None for p in given if p.kind is not p.KEYWORD_ONLY]
        keywords = {p.name: None for p in given if p.kind is p.KEYWORD_ONLY}
        try:
            takes.bind(*positional, **keywords)
        except TypeError as exc:
            names = ", ".join(p.name for p in given) or "none"
            raise InvalidKey(
                f"{fun.__qualname__}: the key function {getattr(key, '__qualname__', key)!r} cannot take the "
                f"task's arguments ({names}): {exc}"
            ) from None
