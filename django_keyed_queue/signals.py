"""Signal handlers wired in ``AppConfig.ready``."""

from __future__ import annotations

from celery.signals import worker_process_init, worker_process_shutdown
from django.core.signals import setting_changed
from django.dispatch import receiver

from .conf import PREFIX
from .connection import reset_gate
from .records import recorder


@worker_process_init.connect
def _fresh_client_per_process(**_: object) -> None:
    reset_gate()


@worker_process_shutdown.connect
def _flush_records(**_: object) -> None:
    recorder.flush()


@receiver(setting_changed)
def _settings_changed(setting: str, **_: object) -> None:
    if setting.startswith(PREFIX):
        reset_gate()
