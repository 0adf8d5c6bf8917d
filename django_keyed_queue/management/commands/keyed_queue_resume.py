from django.core.management.base import CommandError

from django_keyed_queue.ops.actions.recovery import resume

from ._key import KeyCommand, operator


class Command(KeyCommand):
    help = "Resume a paused key and dispatch what waits, up to its limit."

    def act(self, key: str) -> str:
        dispatched = resume(key, by=operator("keyed_queue_resume"))
        if dispatched is None:
            return f"key {key!r} was not paused: nothing changed"
        if dispatched.broker_refused or dispatched.message_refused:
            raise CommandError(f"resumed {key!r}: {dispatched}")
        return f"resumed {key!r}: {dispatched}"
