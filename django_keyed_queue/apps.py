from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class KeyedQueueConfig(AppConfig):
    name = "django_keyed_queue"
    label = "keyed_queue"
    verbose_name = _("Keyed queue")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the system checks)
        from .wiring import signals  # noqa: F401  (connects the signal handlers)
