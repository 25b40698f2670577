from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from django.views.generic import RedirectView

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/inference/", include("approvals.urls")),
    path("approvals/", include("approvals.page_urls")),
    path(
        "accounts/login/",
        auth_views.LoginView.as_view(
            template_name="toolgate_site/login.html", redirect_authenticated_user=True
        ),
        name="login",
    ),
    path(
        "accounts/logout/",
        auth_views.LogoutView.as_view(template_name="toolgate_site/logged_out.html"),
        name="logout",
    ),
    path("", RedirectView.as_view(url="/approvals/", permanent=False)),
]
# Static files never reach these patterns: ServeStaticMiddleware answers them (settings.py).
