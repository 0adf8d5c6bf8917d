from django.core.management.base import BaseCommand

from django_keyed_queue.ops.actions.stop import SIGNALS, stop

from ._key import gate_reachable, operator


class Command(BaseCommand):
    help = (
        "Stop a running keyed task: its worker ends the run's process with the signal given, and only then "
        "does its key move on (its next task never starts beside it). The task fails, stopped by you, or "
        "blocks its key under on_failure='block'."
    )

    def add_arguments(self, parser):
        parser.add_argument("task_id", help="the Celery task id of the running task")
        parser.add_argument(
            "--signal", choices=SIGNALS, default=SIGNALS[0],
            help="what ends its process: SIGTERM lets it run its exit handlers, SIGKILL cannot be ignored",
        )  # fmt: skip

    def handle(self, *args, task_id: str, signal: str, **options):
        with gate_reachable():
            stopped = stop(task_id, by=operator("keyed_queue_stop"), signal=signal)
        self.stdout.write(stopped.said())
