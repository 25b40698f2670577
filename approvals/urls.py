"""The JSON endpoints. Include under any prefix: ``path("api/", include("approvals.urls"))``."""

from django.urls import path

from . import views
from .agentapi import views as agent_views

app_name = "approvals"
urlpatterns = [
    path("tool-confirm", views.tool_confirm, name="tool-confirm"),
    path("tool-approvals", views.tool_approvals, name="tool-approvals"),
    path("tool-approvals/<str:approval_id>", views.tool_approval, name="tool-approval"),
    path("rules", views.rule_list, name="rules"),
    path("rules/<str:pk>/revoke", views.rule_revoke, name="rule-revoke"),
    path("openapi.json", views.openapi, name="openapi"),
    # The agent API (bearer agent keys; see docs/agents-anywhere.md).
    path("approvals", agent_views.create, name="agent-create"),
    path("approvals/<str:approval_id>", agent_views.detail, name="agent-detail"),
    path("approvals/<str:approval_id>/cancel", agent_views.cancel, name="agent-cancel"),
    path("approvals/<str:approval_id>/executed", agent_views.executed, name="agent-executed"),
]
