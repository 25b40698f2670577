"""Long-polls served beside Django's request cycle: no thread per waiting agent.

Django's ASGI handler runs each request in a ``ThreadSensitiveContext`` and
sends ``request_started`` / ``request_finished`` through thread-sensitive
``sync_to_async``: every open request gets a one-thread executor of its own that
lives until the request ends. For a ``GET approvals/<id>?wait=N`` held open for
a minute, that is one idle thread per waiting agent.

:class:`AgentWaitApp` wraps the HTTP application (``toolgate_site/asgi.py``;
docs/install.md for host projects). For a ``GET`` with ``wait`` in its query
whose path Django's resolver maps to the agent ``detail`` view, it calls that
same view itself: the key check, the reads and the wait are the view's own, its
database work runs in the event loop's bounded default executor
(:func:`.auth.run`), and the wait is the listener slot's future. No middleware,
no ``request_started``, no thread; the Host is checked against
``ALLOWED_HOSTS`` first, as Django's request cycle would. Every other request
goes to Django unchanged, and without the wrapper the plain view answers the
same (holding a thread).
"""

from __future__ import annotations

import asyncio
import io
from typing import Any

from django.conf import settings
from django.core.exceptions import DisallowedHost
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpResponse
from django.urls import Resolver404, resolve

from . import views

Scope = dict[str, Any]


def _match(scope: Scope) -> dict[str, Any] | None:
    """The detail view's keyword arguments if ``scope`` is a waiting GET for it."""
    if scope.get("type") != "http" or scope.get("method") != "GET":
        return None
    query = scope.get("query_string", b"")
    if b"wait=" not in query:
        return None
    path = scope.get("path", "")
    root = scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :]
    try:
        found = resolve(path or "/")
    except Resolver404:
        return None
    if found.func is not views.detail or found.args:
        return None
    return dict(found.kwargs)


def _headers(response: HttpResponse) -> list[tuple[bytes, bytes]]:
    headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in response.items()]
    # What SecurityMiddleware adds to every answer of the site.
    if settings.SECURE_CONTENT_TYPE_NOSNIFF and "X-Content-Type-Options" not in response:
        headers.append((b"x-content-type-options", b"nosniff"))
    if getattr(settings, "SECURE_REFERRER_POLICY", None) and "Referrer-Policy" not in response:
        headers.append((b"referrer-policy", str(settings.SECURE_REFERRER_POLICY).encode()))
    headers.append((b"content-length", str(len(response.content)).encode()))
    return headers


def _request_for_allowed_host(scope: Scope) -> ASGIRequest | None:
    """The request, or ``None`` when its Host is not one ``ALLOWED_HOSTS`` accepts."""
    request = ASGIRequest(scope, io.BytesIO())
    try:
        request.get_host()
    except DisallowedHost:
        return None
    return request


async def _until_disconnect(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class AgentWaitApp:
    """ASGI middleware: ``AgentWaitApp(django_asgi_app)`` (HTTP only)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        kwargs = _match(scope)
        request = None if kwargs is None else _request_for_allowed_host(scope)
        if request is None:
            # Not a waiting GET, or a Host not in ALLOWED_HOSTS: Django answers
            # (the latter with the 400 it gives any request naming such a host).
            await self.app(scope, receive, send)
            return
        response = await self._answer(request, receive, kwargs)
        if response is None:
            return  # the agent went away: nobody to answer
        await send(
            {
                "type": "http.response.start",
                "status": response.status_code,
                "headers": _headers(response),
            }
        )
        await send({"type": "http.response.body", "body": response.content})

    async def _answer(self, request: Any, receive: Any, kwargs: dict) -> HttpResponse | None:
        view = asyncio.ensure_future(views.detail(request, **kwargs))
        gone = asyncio.ensure_future(_until_disconnect(receive))
        try:
            await asyncio.wait({view, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if not view.done():
            view.cancel()  # the view's ``finally`` releases the slot
            await asyncio.gather(view, return_exceptions=True)
            return None
        return view.result()  # anything unexpected propagates: the server answers 500
