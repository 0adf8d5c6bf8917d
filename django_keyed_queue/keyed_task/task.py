"""The Celery task base class of keyed serial tasks: hooks only.

The gate decides who may run. This class hands a submission to the producer's side
(``producer.submit``, ``producer.bulk``) and a run to the worker's (``worker.run.Run``),
which call the gate, dispatch what it grants and record it.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Iterable, Mapping
from functools import cached_property
from typing import TYPE_CHECKING, Any, TypeVar

from celery import Task, chord, group
from celery.exceptions import Ignore, Reject, Retry
from celery.utils.functional import chunks as chunked

from ..conf import settings
from ..exceptions import InvalidArguments, InvalidKey
from ..gate import MAX_KEY_LENGTH, Lease
from ..producer.bulk import submit_many
from ..producer.checks import keyed_arguments
from ..producer.submit import in_transaction, submit, submit_on_commit
from ..records.columns import shown, unstorable
from ..records.statuses import Status
from ..worker.run import Run

if TYPE_CHECKING:
    from celery.canvas import Signature
    from celery.result import AsyncResult, EagerResult

    TaskBase = Task[..., Any]
else:
    TaskBase = Task  # Celery before 5.5 cannot subscribe Task at run time

logger = logging.getLogger(__name__)

_R = TypeVar("_R")


class KeyedSerialTask(TaskBase):
    """Tasks sharing a key run one at a time (``serial_limit`` at a time), in submission order."""

    #: A ``str.format`` template over the task's arguments, or a callable taking them.
    serial_key: str | Callable[..., str] = ""
    #: How many tasks of one key may run at once.
    serial_limit: int = 1
    #: How many times a run whose worker was lost (its lease expired) is dispatched
    #: again; after that the task is failed and its key passes on.
    max_recoveries: int = 3
    #: ``rate=``: at most N starts of one key per period (``"5/s"``, ``"30/m"``, ``"100/h"``); None: no pacing.
    serial_rate: str | None = None
    #: The least time between two starts of one key, ms (from ``serial_rate``; 0: none).
    serial_interval_ms: int = 0
    #: ``pool=``: the pool of ``KEYED_QUEUE_POOLS`` the task also needs a slot of; None: none.
    serial_pool: str | None = None
    #: What a task that fails for good (its retries or recoveries used up) does to its key:
    #: ``"continue"``, the key's next task runs; ``"block"``, it keeps its key held, and the key
    #: runs nothing until an operator retries it (it runs again first) or cancels it.
    serial_on_failure: str = "continue"
    #: ``coalesce=True``: a key holds at most one waiting task of this task; a newer submission
    #: replaces it (it never runs; its record ends ``superseded``), the running one is not touched.
    serial_coalesce: bool = False
    #: ``debounce=SECONDS``, in ms (0: none): a key's task starts only once no newer submission of it
    #: came for that long (its message carries that eta); implies ``serial_coalesce``.
    serial_debounce_ms: int = 0
    #: A duplicate submission (same task, same arguments) within the idempotency
    #: window returns the original task instead of running again.
    idempotent: bool = False
    #: Most tasks that may wait behind one key; a submission past it raises KeyQueueFull.
    #: None: ``KEYED_QUEUE_MAX_WAITING`` (no limit unless set).
    max_waiting: int | None = None

    @property
    def blocks_on_failure(self) -> bool:
        """Whether a failure for good keeps the key held (``on_failure="block"``)."""
        return self.serial_on_failure == "block"

    #: The worker's request: ends the attempt its hard time limit kills, and only that one.
    Request = "django_keyed_queue.worker.request:KeyedRequest"

    # -- submission -------------------------------------------------------

    def apply_async(  # type: ignore[override]  # takes idempotency_key; Celery's options as **options
        self,
        args: Iterable[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        **options: Any,
    ) -> AsyncResult[Any]:
        """Celery's ``apply_async``, through the key's queue: returns at once, whether the key is free or busy.

        The key and arguments are checked first (``InvalidKey``, ``InvalidArguments``,
        ``KeyQueueFull``: nothing is written). ``idempotency_key`` makes a duplicate
        within ``KEYED_QUEUE_IDEMPOTENCY_TTL_SECONDS`` return the original task.
        A ``countdown`` or ``eta`` task joins its key's queue when it is due.
        """
        args, kwargs = tuple(args or ()), dict(kwargs or {})
        if self.app.conf.task_always_eager:
            # Celery's eager run: self.apply(). Checked first, as Celery checks the arguments first.
            keyed_arguments(self, args, kwargs, options.get("serializer") or self.serializer)
            return super().apply_async(args, kwargs, **options)
        run: Run | None = getattr(self.request, "keyed_run", None)
        replacing = getattr(self.request, "keyed_replaced", False)
        if run is not None and options.get("task_id") == self.request.id and not replacing:
            return run.retry_in_place(args, kwargs, options)
        if settings.SUBMIT_ON_COMMIT and in_transaction():
            return submit_on_commit(self, args, kwargs, options, idempotency_key)
        return submit(self, args, kwargs, options, idempotency_key)

    def apply_async_many(
        self,
        calls: Iterable[tuple[Any, ...] | list[Any] | dict[str, Any]],
        *,
        idempotency_keys: Iterable[str | None] | None = None,
        batch_size: int = 500,
        **options: Any,
    ) -> list[AsyncResult[Any]]:
        """``apply_async`` of many calls, each a tuple of positional arguments or a dict of keyword
        arguments, with ``options`` for all; their AsyncResults, in order.

        One gate round trip per ``batch_size`` calls. Every call is checked, and its
        message built, before anything is written; a key's tasks run in list order.
        ``idempotency_keys``, if given, has one key (or None) per call.
        """
        return submit_many(self, calls, options, idempotency_keys, batch_size)

    def apply_async_on_commit(
        self,
        args: Iterable[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        **options: Any,
    ) -> AsyncResult[Any]:
        """``apply_async`` when the caller's transaction commits (at once outside one), as Celery's
        ``DjangoTask`` does; bad input raises now. Returns the AsyncResult the task will have."""
        args, kwargs = tuple(args or ()), dict(kwargs or {})
        return submit_on_commit(self, args, kwargs, options, idempotency_key)

    def delay_on_commit(self, *args: Any, **kwargs: Any) -> AsyncResult[Any]:
        """``delay`` when the caller's transaction commits (at once outside one); bad input raises now."""
        return self.apply_async_on_commit(args, kwargs)

    def apply(  # type: ignore[override]  # Celery's options as **options
        self, args: Iterable[Any] | None = None, kwargs: Mapping[str, Any] | None = None, **options: Any
    ) -> EagerResult[Any]:
        """Celery's eager run (``task_always_eager``, ``Task.apply()``), inline and without the gate, after
        the checks a queued submission makes: bad input raises ``InvalidKey`` or ``InvalidArguments``."""
        args, kwargs = tuple(args or ()), dict(kwargs or {})
        keyed_arguments(self, args, kwargs, options.get("serializer") or self.serializer)
        return super().apply(args, kwargs, **options)

    def replace(self, sig: Signature[_R]) -> _R:
        """Celery's ``replace``. The replacement is a new submission with this task's id: a keyed
        one joins the end of its key's queue. This run ends ``ignored`` and its slot passes on."""
        self.request.keyed_replaced = True  # type: ignore[attr-defined]  # Celery's request takes any attribute
        return super().replace(sig)

    # Celery's map, starmap and chunks call the task's function inline, one call after another in
    # one task of their own: outside the key's queue. A keyed task's are groups of its calls.

    def map(self, it: Iterable[Any]) -> group:  # type: ignore[override]  # a group, not an xmap
        """A group calling the task on each item: ``.delay().get()`` returns the list Celery's would."""
        return group(self.s(item) for item in it)

    def starmap(self, it: Iterable[Iterable[Any]]) -> group:  # type: ignore[override]  # not an xstarmap
        """A group calling the task on each argument tuple: ``.delay().get()`` returns Celery's list."""
        return group(self.s(*args) for args in it)

    def chunks(self, it: Iterable[Iterable[Any]], n: int) -> group:  # type: ignore[override]  # not chunks
        """A group of chords of ``n`` calls each: ``.apply_async().get()`` returns Celery's list of lists.

        (A group of groups would be flattened; each chord's body, Celery's ``accumulate``,
        returns its calls' results as one list.)
        """
        collect = self.app.tasks["celery.accumulate"].s(index=0)
        return group(chord([self.s(*args) for args in part], collect.clone()) for part in chunked(iter(it), n))

    def send_plain(self, args: tuple[Any, ...], kwargs: dict[str, Any], **options: Any) -> AsyncResult[Any]:
        """Publish as Celery's own ``apply_async`` does, past the key's queue (a delayed task's message)."""
        return super().apply_async(args, kwargs, **options)

    def key_for(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], bound: inspect.BoundArguments | None = None
    ) -> str:
        """This task's key for these arguments; raises InvalidKey or InvalidArguments."""
        bound = bound or self._bind(args, kwargs)
        spec = self.serial_key
        try:
            key = spec.format(**bound.arguments) if isinstance(spec, str) else spec(*args, **kwargs)
        except Exception as exc:
            raise InvalidKey(f"{self.name}: cannot make the key from {spec!r}: {exc!r}") from exc
        if not isinstance(key, str):
            raise InvalidKey(f"{self.name}: the key must be a str, got {type(key).__name__}: {shown(key)}")
        if not key:
            raise InvalidKey(f"{self.name}: the key is empty")
        problem = unstorable(key, MAX_KEY_LENGTH)
        if problem:
            raise InvalidKey(f"{self.name}: the key {shown(key)} {problem}")
        return key

    def _bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> inspect.BoundArguments:
        signature = self._signature
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as exc:
            if self.typing:
                raise InvalidArguments(f"{self.name}: {exc}") from exc
            # typing=False: Celery sends any arguments (the task fails in the worker); we bind only
            # those the signature takes, for the key.
            fitting_args, fitting_kwargs = _fitting(signature, args, kwargs)
            bound = signature.bind_partial(*fitting_args, **fitting_kwargs)
        bound.apply_defaults()
        return bound

    @cached_property
    def _signature(self) -> inspect.Signature:
        return inspect.signature(self.run)

    # -- execution --------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request
        if request.called_directly:
            return super().__call__(*args, **kwargs)  # Celery's: pushes a request with the arguments
        if request.is_eager:
            # Celery's tracer pushed the request. Inline, nothing else runs: the run holds its key.
            key = keyed_arguments(self, args, kwargs, self.serializer).key
            request.keyed_lease = Lease(key, 0, 0)  # type: ignore[attr-defined]
            return self.run(*args, **kwargs)
        run = Run.begin(self, args, kwargs)
        # Celery's request Context takes any attribute; celery-types lists only Celery's own.
        request.keyed_run, request.keyed_lease, request.keyed_attempts = run, run.lease, run.attempts  # type: ignore[attr-defined]
        try:
            run.check_key(args, kwargs)
            result = self.run(*args, **kwargs)
        except Retry:
            run.let_go()
            raise
        except Reject as exc:
            run.reject(exc)
            raise
        except Ignore:
            # The task chose to end without a result, or replaced itself.
            replaced = getattr(request, "keyed_replaced", False)
            run.finish(Status.IGNORED, error="replaced by a new submission with its id" if replaced else "")
            raise
        except Exception as exc:
            if not run.fail(exc):
                raise Ignore() from exc  # see below
            raise
        except BaseException:
            run.let_go()  # the process is going down; the lease expires and is reaped
            raise
        if not run.succeed():
            # Fenced: another attempt holds the key and will store the task's result. Celery stores
            # none for an ignored run, so a caller waiting on the result never sees this one's.
            raise Ignore()
        return result

    @property
    def keyed_lease(self) -> Lease | None:
        """The running task's lease; ``keyed_lease.token`` is its fencing token (0 in an eager run)."""
        return getattr(self.request, "keyed_lease", None)

    def holds_key(self) -> bool:
        """True while this run still holds its key: its lease was not lost (one round trip).

        Check it before a write that must not happen twice, or store
        ``keyed_lease.token`` with the write and refuse smaller tokens.
        """
        if self.request.is_eager:
            return True  # an eager run (tests) runs inline, without the gate
        run: Run | None = getattr(self.request, "keyed_run", None)
        return run is not None and run.holds_key()

    def superseded(self) -> bool:
        """On a task with ``coalesce=True``: True once a newer submission of it waits behind this run,
        so that a long run may stop early and let the newer one run. Cooperative: nothing is
        killed, and the run ends as the task decides. Read from the gate at most every 100 ms
        (``worker.run.SUPERSEDED_READ_SECONDS``), so it may be asked in a loop; False in an eager run.
        """
        if not self.serial_coalesce:
            raise TypeError(f"{self.name}: superseded() is for tasks with coalesce=True")
        if self.request.is_eager:
            return False
        run: Run | None = getattr(self.request, "keyed_run", None)
        return run is not None and run.superseded()


def _fitting(
    signature: inspect.Signature, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The part of a call that ``signature`` takes: extra positional arguments, unknown keywords and
    keywords given twice are left out."""
    params = list(signature.parameters.values())
    kinds = {p.kind for p in params}
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if inspect.Parameter.VAR_POSITIONAL not in kinds:
        args = args[: len(positional)]
    taken = {p.name for p in positional[: len(args)]}
    by_name = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    if inspect.Parameter.VAR_KEYWORD in kinds:
        return args, {k: v for k, v in kwargs.items() if k not in taken}
    return args, {k: v for k, v in kwargs.items() if k in by_name and k not in taken}
