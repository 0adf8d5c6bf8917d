import contextlib
import json

import redis
from django.core.management.base import BaseCommand, CommandError
from django.db.models import Count, Min
from django.utils import timezone

from django_keyed_queue.gate import Holder
from django_keyed_queue.ops.actions.lookup import operator_key
from django_keyed_queue.ops.console.explain import explain
from django_keyed_queue.records import submissions
from django_keyed_queue.records.models import KeyedTask

from ...process.state import operator_gate
from ._key import gate_reachable

#: How many of a key's waiting tickets are listed (all are counted).
WAITING_SHOWN = 20


class Command(BaseCommand):
    help = (
        "Show the keyed queue: tasks by status, the oldest wait; with --key, that key's holders and queue; "
        "with --task, why that task waits (or what it does now)."
    )

    def add_arguments(self, parser):
        parser.add_argument("--key", help="one logical key, e.g. account:7")
        parser.add_argument("--task", metavar="TASK_ID", help="one task's id: what holds it, in words")
        parser.add_argument("--json", action="store_true", help="with --task: the same as JSON, for scripts")

    def handle(self, *args, key: str | None = None, task: str | None = None, **options):
        if task is not None:
            if key is not None:
                raise CommandError("give --key or --task, not both")
            with gate_reachable():
                explanation = explain(task)
            out = json.dumps(explanation.as_data(), indent=2) if options["json"] else str(explanation)
            self.stdout.write(out)
            return
        if options["json"]:
            raise CommandError("--json goes with --task")
        if key is not None:
            with gate_reachable():
                operator_key(key)
        with contextlib.suppress(redis.RedisError):  # an unreachable Redis is reported below
            submissions.write_due(operator_gate())  # every submission counts, also while no worker runs
        rows = KeyedTask.objects.active() if key is None else KeyedTask.objects.for_key(key).active()
        counts = dict(rows.values_list("status").annotate(n=Count("id")).values_list("status", "n"))
        oldest = rows.filter(status="waiting").aggregate(at=Min("enqueued_at"))["at"]
        self.stdout.write("active tasks: " + (", ".join(f"{s} {n}" for s, n in sorted(counts.items())) or "none"))
        if oldest:
            self.stdout.write(f"oldest wait: {(timezone.now() - oldest).total_seconds():.1f}s")
        with gate_reachable():
            state = operator_gate().inspect(key, waiting_shown=WAITING_SHOWN) if key else None
            operator_gate().client.ping()
        self.stdout.write("redis: reachable")
        knows = state is not None and (state.last_ticket or state.paused)
        if state is not None and not knows and not KeyedTask.objects.for_key(state.key).exists():
            raise CommandError(f"no keyed task has the key {key!r}, and the gate holds nothing of it")
        if state is not None:
            self.stdout.write(f"key {key!r}: {'paused' if state.paused else 'active'}, last ticket {state.last_ticket}")
            held = KeyedTask.objects.holding([state])
            for ticket, holder in sorted(state.holders.items()):
                deadline = "" if holder.state == "blocked" else f", deadline in {holder.deadline_in:.1f}s"
                self.stdout.write(
                    f"  holder {_named(held.get((state.key, ticket)), holder)} (ticket {ticket}): {holder.state}, "
                    f"attempt {holder.attempts}{deadline}"
                )
            if state.blocked is not None:
                task = _named(held.get((state.key, state.blocked)), state.holders.get(state.blocked))
                self.stdout.write(
                    f"  blocked by ticket {state.blocked}: {task} failed; nothing more of the key runs until "
                    "keyed_queue_retry runs it again or keyed_queue_cancel withdraws it"
                )
            more = state.depth - len(state.waiting)
            shown = f"{state.waiting}{f' and {more} more' if more else ''}" if state.waiting else "none"
            self.stdout.write(f"  waiting tickets: {shown}")


def _named(row: KeyedTask | None, holder: Holder | None) -> str:
    """A holder's task as the status names it: by its record, else by its message's task id."""
    if row is not None:
        return f"{row.task_name}[{row.task_id}]"
    return f"task {holder.task_id} (no record yet)" if holder and holder.task_id else "its task (no record)"
