"""Django's tasks framework (``django.tasks``, Django 6.0+, or the ``django-tasks`` backport) on Celery workers.

``TASKS = {"default": {"BACKEND": "django_keyed_queue.tasks_backend.CeleryBackend"}}``, then
``@task(key="account:{account_id}")`` runs serially per key as ``@keyed_serial_task`` does, and
``@task`` without a key is a plain Celery task. Imported only when a project names the backend:
it needs the framework, which Django 4.2 and 5.2 lack.
"""

from .backend import CeleryBackend
from .task import KeyedDjangoTask

__all__ = ["CeleryBackend", "KeyedDjangoTask"]
