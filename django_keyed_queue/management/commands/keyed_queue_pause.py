from django_keyed_queue.ops.actions.recovery import pause

from ._key import KeyCommand, operator


class Command(KeyCommand):
    help = "Pause a key: nothing new is dispatched; submissions still queue in order."

    def act(self, key: str) -> str:
        if not pause(key, by=operator("keyed_queue_pause")):
            return f"key {key!r} was paused already: nothing changed"
        return f"paused {key!r}"
