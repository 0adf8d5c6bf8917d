"""What the keyed queue's commands share: one key argument, and a clear error when Redis is down."""

import getpass
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import redis
from django.core.management.base import BaseCommand, CommandError

from django_keyed_queue.exceptions import ActionRefused
from django_keyed_queue.ops.actions import AUDIT_LOGGER
from django_keyed_queue.ops.actions.lookup import operator_key


@contextmanager
def gate_reachable() -> Iterator[None]:
    """A Redis error, or an action that does not apply, becomes a one-line CommandError (exit status 1).

    The command prints its own result, so the action's INFO audit record is kept off the terminal;
    the project's other handlers (files, syslog) still receive it.
    """
    consoles = _console_handlers(logging.getLogger(AUDIT_LOGGER))
    for handler in consoles:
        handler.addFilter(_said_by_the_command)
    try:
        yield
    except redis.RedisError as exc:
        raise CommandError(f"the keyed queue's Redis is unreachable: {exc}") from exc
    except ActionRefused as exc:
        raise CommandError(str(exc)) from exc
    finally:
        for handler in consoles:
            handler.removeFilter(_said_by_the_command)


def _said_by_the_command(record: logging.LogRecord) -> bool:
    return not (record.name == AUDIT_LOGGER and record.levelno <= logging.INFO)


def _console_handlers(logger: logging.Logger | None) -> list[logging.Handler]:
    found: list[logging.Handler] = []
    while logger is not None:
        found += [
            h
            for h in logger.handlers
            if isinstance(h, logging.StreamHandler) and getattr(h, "stream", None) in (sys.stdout, sys.stderr)
        ]
        logger = logger.parent if logger.propagate else None
    return found


def operator(command: str) -> str:
    """Who acts, as the audit log and the task's record say: the user running ``command``."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # a container's uid without a name
        user = "an operator"
    return f"{user} (manage.py {command})"


class KeyCommand(BaseCommand):
    def add_arguments(self, parser):
        parser.add_argument("key", help="the logical key, e.g. account:7")

    def handle(self, *args, key: str, **options):
        with gate_reachable():
            self.stdout.write(self.act(operator_key(key)))

    def act(self, key: str) -> str:
        raise NotImplementedError
