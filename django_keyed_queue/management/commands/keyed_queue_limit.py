from django.core.management.base import CommandError

from django_keyed_queue.ops.actions.limits import DEFAULT, set_typed
from django_keyed_queue.ops.display import rate_said

from ...ops.console.live import pool_state
from ...process.state import console_gate, operator_gate
from ._key import KeyCommand, gate_reachable, operator


class Command(KeyCommand):
    help = (
        "Give a key, or with --pool a pool, a limit (tasks at once) or a rate of its own, over its tasks' (kept "
        f"in Redis, not in the database), or '{DEFAULT}' for theirs again; with neither, show what it has."
    )

    def add_arguments(self, parser):
        parser.add_argument("key", nargs="?", help="the logical key, e.g. account:7 (not with --pool)")
        parser.add_argument("limit", nargs="?", help=f"how many of its tasks may run at once, or {DEFAULT}")
        parser.add_argument("--rate", help=f'the most starts: "10/s", "30/m", "100/h", or {DEFAULT}')
        parser.add_argument("--pool", help="a pool of KEYED_QUEUE_POOLS instead of a key, e.g. payments")

    def handle(self, *args, key: str | None = None, limit: str | None = None, pool: str | None = None, **options):
        if pool is not None:
            if limit is not None:
                raise CommandError(f"with --pool, give only the limit: got {key!r} and {limit!r}")
            key, limit = None, key  # `keyed_queue_limit --pool payments 5`: the one positional is the limit
        elif key is None:
            raise CommandError("give a key (e.g. account:7), or --pool and a pool's name")
        if limit is not None and limit != DEFAULT and not (limit.isascii() and limit.isdigit()):
            raise CommandError(f"the limit is a whole number >= 1 or {DEFAULT!r}, got {limit!r}")
        self._limit, self._rate = limit, options.get("rate")
        if pool is None:
            assert key is not None
            super().handle(*args, key=key, **options)
            return
        with gate_reachable():
            self.stdout.write(self.act_on_pool(pool))

    def act(self, key: str) -> str:
        said = set_typed(key=key, limit=self._limit or "", rate=self._rate or "", by=operator("keyed_queue_limit"))
        state = operator_gate().inspect(key, waiting_shown=0)
        return _now(f"key {key!r}", said, state.limit_override, "its tasks'", state.interval_override_ms)

    def act_on_pool(self, pool: str) -> str:
        said = set_typed(pool=pool, limit=self._limit or "", rate=self._rate or "", by=operator("keyed_queue_limit"))
        state = pool_state(console_gate(), pool)  # as the live keys page's pools table has it
        limit = state.limit_override or f"{DEFAULT} ({state.own_limit or 'none'}, the settings')"
        rate = state.rate_override or f"{DEFAULT} ({state.own_rate or 'none'}, the settings')"
        done = f"{said} -> " if said else ""
        return f"pool {pool!r}: {done}limit {limit}, rate {rate}; {state.running} running, {state.waiting} waiting"


def _now(what: str, said: str, limit: int | None, own: str, interval_ms: int | None) -> str:
    """What was set, then the limit and rate a key or pool has now (an operator's, or ``DEFAULT``)."""
    rate = rate_said(interval_ms) if interval_ms else DEFAULT
    return f"{what}: " + (f"{said} -> " if said else "") + f"limit {limit or f'{DEFAULT} ({own})'}, rate {rate}"
