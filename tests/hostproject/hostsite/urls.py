"""The host's URL layout: nothing where ``toolgate_site`` puts it."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("backoffice/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    path("agent-gate/v1/", include("approvals.urls")),
    path("review/", include("approvals.page_urls")),
]
