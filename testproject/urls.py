from django.contrib import admin
from django.urls import path

from django_keyed_queue.views import health

urlpatterns = [
    path("admin/", admin.site.urls),
    path("keyed-queue/health/", health),
]
