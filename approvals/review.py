"""The page for one call, ``/approvals/<approval_id>/``: the target of every link sent out.

Login required; a call the viewer may not see is a 404, exactly like an unknown
one. The page shows the call, answers it through ``tool-confirm`` (the HTTP
endpoint the inbox falls back to), and follows its state live over the inbox's
WebSocket (narrowed to the call's session), polling ``tool-approvals`` while the
socket is down. Its script is a small ES module (``approvals/review.js``).
"""

from __future__ import annotations

import json

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render, resolve_url
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from .models import Approval
from .pages import add_content_security_policy
from .wsroute import inbox_websocket_url


def _pretty(value) -> str:
    return json.dumps(value, ensure_ascii=False, indent=2, sort_keys=False)


@require_safe
@never_cache
@login_required
def review(request: HttpRequest, approval_id: str) -> HttpResponse:
    """Render one call for a person who may decide it (404 for anyone else)."""
    visible = Approval.objects.visible_to(request.user).select_related("decided_by")
    approval = get_object_or_404(visible, approval_id=approval_id)
    context = {
        "approval": approval,
        "viewer": request.user,
        "arguments": _pretty(approval.arguments),
        "edited_arguments": (
            _pretty(approval.edited_arguments) if approval.edited_arguments is not None else ""
        ),
        "arguments_schema": (
            json.dumps(approval.arguments_schema) if approval.arguments_schema is not None else ""
        ),
        "websocket_url": inbox_websocket_url(),
        "login_url": resolve_url(settings.LOGIN_URL),
    }
    response = render(request, "approvals/review.html", context)
    return add_content_security_policy(response, context["websocket_url"])
