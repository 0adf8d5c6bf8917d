from django.core.management.base import BaseCommand

from django_keyed_queue.ops.rebuild import rebuild

from ._key import gate_reachable


class Command(BaseCommand):
    help = (
        "Restore the keyed queue's gate from the KeyedTask records after its Redis was lost: "
        "every unfinished task runs again, in ticket order. Keys still present in Redis are left alone. "
        "Submissions whose rows were not written yet (the last KEYED_QUEUE_RECORD_DELAY_SECONDS before the "
        "loss, with a worker running) are not in the records and cannot be restored."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="report what a real run would restore and skip, writing nothing (not even the records Redis keeps)",
        )

    def handle(self, *args, dry_run: bool = False, **options):
        with gate_reachable():
            report = rebuild(dry_run=dry_run)
        for key, count in sorted(report.restored.items()):
            tasks = f"{count} task{'' if count == 1 else 's'}"
            self.stdout.write(f"{'would restore' if dry_run else 'restored'} {tasks} of key={key!r}")
        for key in report.skipped:
            self.stdout.write(f"skipped key={key!r}: it is live in Redis")
        for task_id in report.unrecoverable:
            self.stderr.write(f"cannot restore task {task_id}: its record has no stored message")
        for task_id in report.unpublished:
            self.stderr.write(f"task {task_id} was granted but the broker refused it; the reaper publishes it again")
        self.stdout.write(("dry run: " if dry_run else "") + report.summary())
        if report.unrecoverable or report.unpublished:
            raise SystemExit(1)
