"""The inbox page: the pending tool calls a person may decide, live.

The page itself is a template plus a small ES module (``approvals/inbox.js``).
It learns every endpoint from the page (``{% url %}``-rendered data attributes
and the ``INBOX_WEBSOCKET_URL`` setting), so the app's URL modules can be
mounted under any prefix. Include :mod:`approvals.page_urls` to serve it.
"""

from __future__ import annotations

import json
import re
import unicodedata
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render, resolve_url
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from . import payloads
from .errors import RequestError
from .models import Approval, Status
from .wsroute import inbox_websocket_url

#: How many recent decisions the page lists below the pending calls.
HISTORY_LENGTH = 12

#: The page's own policy, used when the host has not configured Django's CSP
#: (Django 6+). Inline script and inline event handlers never run.
CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)

_SAFE_ORIGIN = re.compile(r"^[A-Za-z0-9.\-\[\]:]+$")
_DJANGO_CSP_MIDDLEWARE = "django.middleware.csp.ContentSecurityPolicyMiddleware"


def _session_filter(request: HttpRequest) -> str:
    try:
        return payloads.session_filter(request.GET.get("session_id")) or ""
    except RequestError:  # it cannot match a session: the page shows every session
        return ""


def recent_decisions(user: Any, session_id: str = "", limit: int = HISTORY_LENGTH) -> list:
    """The most recent decided calls ``user`` may see, newest first.

    An allowed call carries ``approved_text``: the arguments it was allowed with (the
    person's edit if they made one), as the page shows them.
    """
    qs = Approval.objects.visible_to(user).decided().in_session(session_id)
    qs = qs.select_related("decided_by")
    calls = list(qs.order_by("-decided_at", "-pk")[:limit])
    for call in calls:
        if call.status == Status.ALLOWED:
            ran = call.edited_arguments if call.edited_arguments is not None else call.arguments
            call.approved_text = reveal(json.dumps(ran, indent=2, ensure_ascii=False))
    return calls


def reveal(text: str) -> str:
    """``text`` with each invisible or direction-changing character written ``⟨U+XXXX⟩``.

    As the page's script does: format characters (category Cf), line and paragraph
    separators, and controls other than newline and tab are shown, not obeyed.
    """
    return "".join(
        f"⟨U+{ord(ch):04X}⟩"
        if unicodedata.category(ch) == "Cf"
        or ch in "\u2028\u2029"
        or (unicodedata.category(ch) == "Cc" and ch not in "\n\t")
        else ch
        for ch in text
    )


def uses_django_csp() -> bool:
    """True when Django's own CSP middleware is installed and has a policy to send."""
    return _DJANGO_CSP_MIDDLEWARE in settings.MIDDLEWARE and bool(
        getattr(settings, "SECURE_CSP", None)
    )


def add_content_security_policy(response: HttpResponse, websocket_url: str = "") -> HttpResponse:
    """Give ``response`` the page's CSP unless Django's CSP middleware will send one.

    A WebSocket on another origin (an absolute ``ws(s)://`` URL) is added to
    ``connect-src``; everything else stays ``'self'``.
    """
    if uses_django_csp() or "Content-Security-Policy" in response:
        return response
    policy = CONTENT_SECURITY_POLICY
    parts = urlsplit(websocket_url)
    if parts.scheme in ("ws", "wss") and parts.netloc and _SAFE_ORIGIN.match(parts.netloc):
        origin = f"{parts.scheme}://{parts.netloc}"
        policy = policy.replace("connect-src 'self'", f"connect-src 'self' {origin}")
    response["Content-Security-Policy"] = policy
    return response


@require_safe
@never_cache
@login_required
def inbox(request: HttpRequest) -> HttpResponse:
    """Render the inbox for the signed-in user, optionally narrowed to one session.

    Anonymous visitors are redirected to ``settings.LOGIN_URL``. The pending
    calls themselves arrive over the WebSocket (a snapshot on every connect);
    the page renders the recent history so it is useful before the socket opens.
    """
    session_id = _session_filter(request)
    context = {
        "session_id": session_id,
        # Given here, so the page works without the "request" context processor.
        "viewer": request.user,
        "page_path": request.path,
        "websocket_url": inbox_websocket_url(),
        "history": recent_decisions(request.user, session_id),
        "login_url": resolve_url(settings.LOGIN_URL),
        "server_time": timezone.now().isoformat(),
    }
    response = render(request, "approvals/inbox.html", context)
    return add_content_security_policy(response, context["websocket_url"])
