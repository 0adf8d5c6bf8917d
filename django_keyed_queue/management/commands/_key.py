"""The shared shape of commands that act on one logical key."""

from django.core.management.base import BaseCommand, CommandError

from django_keyed_queue.gate import MAX_KEY_LENGTH


class KeyCommand(BaseCommand):
    def add_arguments(self, parser):
        parser.add_argument("key", help="the logical key, e.g. account:7")

    def handle(self, *args, key: str, **options):
        if not key or len(key) > MAX_KEY_LENGTH:
            raise CommandError(f"a key is 1 to {MAX_KEY_LENGTH} characters, got {key!r}")
        self.stdout.write(self.act(key))

    def act(self, key: str) -> str:
        raise NotImplementedError
