from django.core.management.base import BaseCommand, CommandError

from django_keyed_queue.ops.actions.recovery import reap

from ._key import gate_reachable


class Command(BaseCommand):
    help = "Recover keyed tasks whose worker was lost (expired leases) and granted tasks never started."

    def add_arguments(self, parser):
        parser.add_argument("--dry-run", action="store_true", help="report what would be done, change nothing")

    def handle(self, *args, dry_run: bool = False, **options):
        with gate_reachable():
            report = reap(dry_run=dry_run)
        for r in report.recoveries:
            self.stdout.write(f"{'would ' if dry_run else ''}{r.action} key={r.key!r} ticket={r.ticket}")
        if report.unpublished:
            raise CommandError(report.summary())
        self.stdout.write(("dry run: " if dry_run else "") + report.summary())
