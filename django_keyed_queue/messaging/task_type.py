"""A keyed task as the layers below its class use it.

``keyed_task.task.KeyedSerialTask`` is the class with this shape. The producer's
side, the worker's side and the message take a ``KeyedTaskProtocol`` instead of that
class, so that they need not import the layer above them, which imports them.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from celery import Celery
    from celery.app.task import Context
    from celery.result import AsyncResult as Result


class KeyedTaskProtocol(Protocol):
    """The Celery task attributes and the keyed ones that submissions, runs and messages read."""

    # Celery's own.
    @property
    def name(self) -> str: ...
    @property
    def app(self) -> Celery: ...
    @property
    def request(self) -> Context: ...
    @property
    def serializer(self) -> str: ...
    @property
    def ignore_result(self) -> bool: ...
    @property
    def acks_late(self) -> bool: ...
    @property
    def time_limit(self) -> int | None: ...
    @property
    def soft_time_limit(self) -> int | None: ...
    def AsyncResult(self, task_id: str, **kwargs: Any) -> Result[Any]: ...
    def shadow_name(self, args: tuple[Any, ...], kwargs: dict[str, Any], options: dict[str, Any]) -> str | None: ...

    # The keyed task's.
    @property
    def idempotent(self) -> bool: ...
    @property
    def max_waiting(self) -> int | None: ...
    @property
    def serial_limit(self) -> int: ...
    @property
    def serial_rate(self) -> str | None: ...
    @property
    def serial_interval_ms(self) -> int: ...
    @property
    def max_recoveries(self) -> int: ...
    @property
    def blocks_on_failure(self) -> bool: ...
    def apply_async(
        self,
        args: Iterable[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        **options: Any,
    ) -> Result[Any]: ...
    def send_plain(self, args: tuple[Any, ...], kwargs: dict[str, Any], **options: Any) -> Result[Any]: ...
    def key_for(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], bound: inspect.BoundArguments | None = None
    ) -> str: ...
    def _bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> inspect.BoundArguments: ...
