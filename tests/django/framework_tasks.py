"""Django tasks (``@task``) of the django tier, run by ``CeleryBackend``: submitted to a queue no worker consumes.

Imported only by tests that have Django's tasks framework (Django 6.0+, or the django-tasks backport).
"""

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task

from tests.django.queues import QUEUE


@task(key="{key}", queue_name=QUEUE)
def keyed_step(key, n, seconds=0.0):
    return n


@task(queue_name=QUEUE)
def plain_step(key, n, seconds=0.0):
    return n


def undecorated(key, n):
    """Decorated by the tests, with options @task refuses."""
