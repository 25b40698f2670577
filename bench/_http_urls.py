"""The site's routes plus ``/bench/ping`` (see bench/_http_settings.py)."""

from django.http import JsonResponse
from django.urls import path

from toolgate_site.urls import urlpatterns as site_patterns


def ping(request):
    return JsonResponse({"ok": True})


urlpatterns = [path("bench/ping", ping), *site_patterns]
