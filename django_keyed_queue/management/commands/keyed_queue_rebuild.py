from django.core.management.base import BaseCommand

from django_keyed_queue.ops.actions.rebuild import rebuild

from ._key import gate_reachable


class Command(BaseCommand):
    help = (
        "Restore the keyed queue's gate from the KeyedTask records after its Redis was lost: every unfinished "
        "task the gate no longer keeps runs, in ticket order; in a key that took submissions since, before the "
        "tasks waiting there. A task that was running at the loss may have ended: it is marked lost, not run "
        "again, unless --rerun-running. Submissions whose rows were not written yet (the last "
        "KEYED_QUEUE_RECORD_DELAY_SECONDS before the loss, with a worker running) are not in the records and "
        "cannot be restored."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="report what a real run would do to each key, writing nothing (not even the records Redis keeps)",
        )
        parser.add_argument(
            "--rerun-running",
            action="store_true",
            help="run again the tasks that were running when Redis was lost, first in their keys, knowing each "
            "may have ended or may still run (by default they are marked lost)",
        )

    def handle(self, *args, dry_run: bool = False, rerun_running: bool = False, **options):
        with gate_reachable():
            report = rebuild(dry_run=dry_run, rerun_running=rerun_running)
        for line in report.lines(dry_run):
            self.stdout.write(line)
        for task_id in report.unrecoverable:
            self.stderr.write(f"cannot restore task {task_id}: its record has no stored message of its own")
        for task_id in report.unpublished:
            self.stderr.write(f"task {task_id} was granted but the broker refused it; the reaper publishes it again")
        for key in report.failed:
            self.stderr.write(f"key={key!r} could not be restored (see the log); run the rebuild again")
        self.stdout.write(("dry run: " if dry_run else "") + report.summary())
        if report.unrecoverable or report.unpublished or report.failed:
            raise SystemExit(1)
