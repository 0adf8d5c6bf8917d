from django.core.management.base import CommandError

from django_keyed_queue.ops.display import rate_said
from django_keyed_queue.ops.limits import DEFAULT, set_typed
from django_keyed_queue.process.state import get_gate

from ._key import KeyCommand, operator


class Command(KeyCommand):
    help = (
        "Give a key a limit (tasks at once) or a rate of its own, over its tasks' (kept in Redis, not in the "
        f"database), or '{DEFAULT}' for theirs again; with neither, show what the key has."
    )

    def add_arguments(self, parser):
        super().add_arguments(parser)
        parser.add_argument("limit", nargs="?", help=f"how many of the key's tasks may run at once, or {DEFAULT}")
        parser.add_argument("--rate", help=f'the most starts of the key: "10/s", "30/m", "100/h", or {DEFAULT}')

    def handle(self, *args, key: str, limit: str | None = None, rate: str | None = None, **options):
        if limit is not None and limit != DEFAULT and not (limit.isascii() and limit.isdigit()):
            raise CommandError(f"the limit is a whole number >= 1 or {DEFAULT!r}, got {limit!r}")
        self._limit, self._rate = limit, rate
        super().handle(*args, key=key, **options)

    def act(self, key: str) -> str:
        said = set_typed(key, self._limit or "", self._rate or "", by=operator("keyed_queue_limit"))
        state = get_gate().inspect(key, waiting_shown=0)
        limit = state.limit_override or f"{DEFAULT} (its tasks')"
        rate = rate_said(state.interval_override_ms) if state.interval_override_ms else f"{DEFAULT}"
        done = f"key {key!r}: " + (f"{said} -> " if said else "")
        return f"{done}limit {limit}, rate {rate}"
