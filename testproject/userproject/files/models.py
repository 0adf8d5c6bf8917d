"""The user project's model (appended to the models.py that startapp made)."""

from django.db import models


class Order(models.Model):
    """A row a transaction writes before it enqueues a task that reads it."""

    name = models.CharField(max_length=50)

    def __str__(self) -> str:
        return self.name


class Account(models.Model):
    """A user's own row: each task of the benchmark's realistic workload reads one and updates it
    (bench/userproject.py)."""

    name = models.CharField(max_length=50)
    syncs = models.PositiveIntegerField(default=0)
    synced_at = models.DateTimeField(null=True)

    def __str__(self) -> str:
        return self.name
