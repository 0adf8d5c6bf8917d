"""What the keyed queue's commands share: one key argument, and a clear error when Redis is down."""

from collections.abc import Iterator
from contextlib import contextmanager

import redis
from django.core.management.base import BaseCommand, CommandError

from django_keyed_queue.exceptions import ActionRefused
from django_keyed_queue.recovery import checked_key


@contextmanager
def gate_reachable() -> Iterator[None]:
    """A Redis error, or an action that does not apply, becomes a one-line CommandError (exit status 1)."""
    try:
        yield
    except redis.RedisError as exc:
        raise CommandError(f"the keyed queue's Redis is unreachable: {exc}") from exc
    except ActionRefused as exc:
        raise CommandError(str(exc)) from exc


class KeyCommand(BaseCommand):
    def add_arguments(self, parser):
        parser.add_argument("key", help="the logical key, e.g. account:7")

    def handle(self, *args, key: str, **options):
        with gate_reachable():
            self.stdout.write(self.act(checked_key(key)))

    def act(self, key: str) -> str:
        raise NotImplementedError
