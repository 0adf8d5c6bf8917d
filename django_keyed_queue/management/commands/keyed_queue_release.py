from django.core.management.base import CommandError

from django_keyed_queue.ops.actions.lookup import operator_key
from django_keyed_queue.ops.actions.recovery import release
from django_keyed_queue.records.models import KeyedTask

from ...process.state import operator_gate
from ._key import KeyCommand, gate_reachable, operator


class Command(KeyCommand):
    help = (
        "Release a key's stuck holder now, as the reaper does when its lease expires: its run is fenced and "
        "its task dispatched again (or failed, once it used its recoveries)."
    )

    def add_arguments(self, parser):
        super().add_arguments(parser)
        parser.add_argument("--ticket", type=int, help="the holder's ticket, when the key has several holders")

    def handle(self, *args, key: str, ticket: int | None = None, **options):
        with gate_reachable():
            self.stdout.write(self.release(operator_key(key), ticket))

    def release(self, key: str, ticket: int | None) -> str:
        state = operator_gate().inspect(key, waiting_shown=0)
        if ticket is None:
            holders = sorted(state.holders)
            if not holders:
                raise CommandError(f"key {key!r} has no holder to release")
            if len(holders) > 1:
                raise CommandError(f"key {key!r} has {len(holders)} holders, tickets {holders}: name one with --ticket")
            [ticket] = holders
        holder = state.holders.get(ticket)
        task_id = holder.task_id if holder else None  # the task seen holding it, and no other, is released
        done = release(key, ticket, task_id=task_id, by=operator("keyed_queue_release"))
        row = KeyedTask.objects.holding([state]).get((key, ticket))
        task = f"{row.task_name}[{row.task_id}]" if row else f"task {task_id}" if task_id else "its task"
        done = [r for r in done if r.ticket == ticket]
        what = ", ".join(f"{r.action} (attempt {r.attempts}, dispatch {r.dispatch})" for r in done)
        return f"released {task} (ticket {ticket}) of key {key!r}: {what}"
