"""The user project's model (appended to the models.py that startapp made)."""

from django.db import models


class Order(models.Model):
    """A row a transaction writes before it enqueues a task that reads it."""

    name = models.CharField(max_length=50)

    def __str__(self) -> str:
        return self.name
