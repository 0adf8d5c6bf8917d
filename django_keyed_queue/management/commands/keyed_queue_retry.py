from django.core.management.base import BaseCommand

from django_keyed_queue.ops.actions.recovery import retry
from django_keyed_queue.records.models import KeyedTask

from ._key import gate_reachable, operator


class Command(BaseCommand):
    help = (
        "Run a failed keyed task again: one that blocks its key (on_failure='block') runs again before "
        "the key's other tasks; any other is submitted again, as a new task, at the end of its key's queue."
    )

    def add_arguments(self, parser):
        parser.add_argument("task_id", help="the Celery task id of the failed task")

    def handle(self, *args, task_id: str, **options):
        with gate_reachable():
            runs = retry(task_id, by=operator("keyed_queue_retry"))
        row = KeyedTask.objects.filter(task_id=runs).order_by("-id").first()
        key = row.key if row else "?"
        if runs == task_id:
            self.stdout.write(f"retried task {task_id} first on key {key!r}: it runs again before the key's others")
        else:
            self.stdout.write(f"retried task {task_id} as task {runs} at the end of the queue of key {key!r}")
