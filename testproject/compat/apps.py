from django.apps import AppConfig


class CompatConfig(AppConfig):
    """The tasks of the compatibility tier (tests/compat): plain Celery tasks and their keyed twins."""

    name = "testproject.compat"
    label = "compat"

    def ready(self) -> None:
        from . import signals  # noqa: F401  (connects the receivers that write the journal)
