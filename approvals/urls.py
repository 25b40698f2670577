"""The JSON endpoints. Include under any prefix: ``path("api/", include("approvals.urls"))``."""

app_name = "approvals"
urlpatterns: list = []
