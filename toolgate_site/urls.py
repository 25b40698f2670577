from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/inference/", include("approvals.urls")),
    path("", RedirectView.as_view(url="/approvals/", permanent=False)),
]
