"""A user's test module: keyed tasks run inline in eager mode (CELERY_TASK_ALWAYS_EAGER), and bad input
fails here as it would in production."""

from django.db import transaction
from django.test import TestCase

from django_keyed_queue import InvalidArguments, InvalidKey

from .tasks import by_callable, step


class KeyedTasksInEagerMode(TestCase):
    def test_a_task_runs_inline(self):
        self.assertEqual(by_callable.delay(7, 1).get(), 1)

    def test_a_bad_key_fails_at_the_call(self):
        with self.assertRaises(InvalidKey):
            by_callable.delay(None, 1)

    def test_missing_arguments_fail_at_the_call(self):
        with self.assertRaises(InvalidArguments):
            step.delay("k")

    def test_delay_on_commit_runs_at_the_commit(self):
        with self.captureOnCommitCallbacks(execute=True) as callbacks:
            with transaction.atomic():
                step.delay_on_commit("k", 2)
        self.assertEqual(len(callbacks), 1)
