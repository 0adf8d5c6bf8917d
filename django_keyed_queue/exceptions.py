"""Errors raised to users of keyed tasks."""


class KeyedQueueError(Exception):
    """Base class of every error this package raises."""


class InvalidKey(KeyedQueueError, ValueError):
    """The task's key could not be made from its arguments, or is not a usable key."""


class InvalidArguments(KeyedQueueError, TypeError):
    """The arguments do not fit the task's signature or cannot be serialized."""


class GateUnavailable(KeyedQueueError):
    """The gate's Redis could not be reached; nothing was submitted."""


class ActionRefused(KeyedQueueError):
    """An operator's action does not apply to the task or key as it is now; nothing was changed."""
