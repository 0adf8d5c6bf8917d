from django.core.management.base import BaseCommand

from django_keyed_queue.ops.actions.run_now import run_now

from ._key import gate_reachable, operator


class Command(BaseCommand):
    help = (
        "Start a keyed task that waits for a time now, once: a debounced task, one waiting for its key's rate, "
        "or one sent with a countdown or eta (which then joins its key's queue now, behind the key's earlier tasks)."
    )

    def add_arguments(self, parser):
        parser.add_argument("task_id", help="the Celery task id of the waiting task")

    def handle(self, *args, task_id: str, **options):
        with gate_reachable():
            self.stdout.write(run_now(task_id, by=operator("keyed_queue_run_now")))
