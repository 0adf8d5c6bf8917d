"""Errors raised to users of keyed tasks."""

from kombu.exceptions import EncodeError


class KeyedQueueError(Exception):
    """Base class of every error this package raises."""


class InvalidKey(KeyedQueueError, ValueError):
    """The task's key could not be made from its arguments, or is not a usable key."""


class InvalidArguments(KeyedQueueError, TypeError):
    """The arguments do not fit the task's signature or cannot be serialized."""


class UnencodableArguments(InvalidArguments, EncodeError):
    """The task's serializer cannot encode the arguments: kombu's ``EncodeError``, as Celery raises it."""


class IdempotencyConflict(InvalidArguments):
    """An explicit idempotency key was used before with other arguments; nothing was submitted."""


class KeyQueueFull(KeyedQueueError):
    """The key has as many tasks waiting as its ``max_waiting`` allows; nothing was submitted."""


class GateUnavailable(KeyedQueueError):
    """The gate's Redis could not be reached; nothing was submitted."""


class ActionRefused(KeyedQueueError):
    """An operator's action does not apply to the task or key as it is now; nothing was changed."""


class MessageRefused(KeyedQueueError):
    """A stored task message is not one the app accepts (``accept_content``) or is malformed; nothing was decoded."""

    def __init__(self, task_name: str, task_id: str, reason: str) -> None:
        super().__init__(f"the stored message of {task_name}[{task_id}] is refused: {reason}")
        self.task_name, self.task_id, self.reason = task_name, task_id, reason
