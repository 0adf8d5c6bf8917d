from django.core.management.base import BaseCommand, CommandError

from django_keyed_queue.gate import MAX_KEY_LENGTH
from django_keyed_queue.recovery import resume


class Command(BaseCommand):
    help = "Resume a paused key and dispatch what waits, up to its limit."

    def add_arguments(self, parser):
        parser.add_argument("key", help="the logical key, e.g. account:7")

    def handle(self, *args, key: str, **options):
        if not key or len(key) > MAX_KEY_LENGTH:
            raise CommandError(f"a key is 1 to {MAX_KEY_LENGTH} characters, got {key!r}")
        dispatched = resume(key)
        self.stdout.write(f"resumed {key!r}: {dispatched} dispatched")
