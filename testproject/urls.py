import os

from django.contrib import admin
from django.urls import path

from django_keyed_queue import health, metrics

urlpatterns = [
    path("admin/", admin.site.urls),
    path("keyed-queue/health/", health),
    path("keyed-queue/metrics/", metrics),
]

if os.environ.get("TESTPROJECT_FORGET_CONTENT_TYPES") == "1":
    # The browser tests flush the database between tests, which renumbers the content types
    # this long-running server would otherwise keep cached (the admin's log refers to them).
    from django.contrib.contenttypes.models import ContentType
    from django.core.signals import request_started

    request_started.connect(lambda **_: ContentType.objects.clear_cache(), weak=False)
