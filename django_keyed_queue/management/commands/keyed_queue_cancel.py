from django.core.management.base import BaseCommand

from django_keyed_queue.ops.actions.recovery import cancel
from django_keyed_queue.records.statuses import Status

from ._key import gate_reachable, operator


class Command(BaseCommand):
    help = (
        "Cancel a keyed task that waits for its key (it never runs), or a failed one that blocks its key "
        "(on_failure='block'): the key's next task runs."
    )

    def add_arguments(self, parser):
        parser.add_argument("task_id", help="the Celery task id of the task")

    def handle(self, *args, task_id: str, **options):
        with gate_reachable():
            row = cancel(task_id, by=operator("keyed_queue_cancel"))
        if row.status == Status.FAILED:
            self.stdout.write(f"cancelled task {task_id}, which failed and blocked key {row.key!r}: the key moves on")
        else:
            self.stdout.write(f"cancelled task {task_id} ({row.status}, key {row.key!r}): it will not run")
