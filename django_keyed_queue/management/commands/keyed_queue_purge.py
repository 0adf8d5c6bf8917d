from django.core.management.base import BaseCommand

from django_keyed_queue.records.idempotency import purge


class Command(BaseCommand):
    help = "Delete expired idempotency keys (cron-safe; celery beat runs it hourly unless told otherwise)."

    def handle(self, *args, **options):
        self.stdout.write(f"deleted {purge()} expired idempotency keys")
