"""The JSON endpoints. Include under any prefix: ``path("api/", include("approvals.urls"))``."""

from django.urls import path

from . import views

app_name = "approvals"
urlpatterns = [
    path("tool-confirm", views.tool_confirm, name="tool-confirm"),
    path("tool-approvals", views.tool_approvals, name="tool-approvals"),
    path("rules", views.rule_list, name="rules"),
    path("rules/<str:pk>/revoke", views.rule_revoke, name="rule-revoke"),
    path("openapi.json", views.openapi, name="openapi"),
]
