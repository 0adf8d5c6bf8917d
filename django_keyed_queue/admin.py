"""Django's admin loads ``<app>.admin``: the operator's admin lives in ``ops.admin``."""

from .ops.console import admin  # noqa: F401
