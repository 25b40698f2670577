"""The host's URL layout: nothing where ``toolgate_site`` puts it."""

from importlib.util import find_spec

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("backoffice/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    path("agent-gate/v1/", include("approvals.urls")),
]

if find_spec("approvals.page_urls") is not None:
    urlpatterns.append(path("review/", include("approvals.page_urls")))
