"""The agent endpoints' common ground: bearer keys, methods, errors as JSON, no thread held.

Agents authenticate with ``Authorization: Bearer <key>`` only: no cookies,
no sessions, so no CSRF. Every view is ``async``; its database work runs in
the shared executor (:func:`run`), never in a thread of its own, so a request
that waits holds no thread.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from functools import wraps
from typing import Any

from asgiref.sync import sync_to_async
from django.db import DatabaseError, close_old_connections
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from .. import agentkeys, errors
from ..errors import RequestError
from ..jsonapi import error_response

logger = logging.getLogger("approvals.agentapi")


async def run(fn: Callable[..., Any], *args: Any) -> Any:
    """Run ``fn(*args)`` (database work) in the shared executor, not a per-request thread.

    Django would give each request a thread of its own for thread-sensitive
    code and keep it until the request ends: one idle thread per waiting agent.
    Connections are closed or kept afterwards as ``CONN_MAX_AGE`` says.
    """

    def work() -> Any:
        try:
            return fn(*args)
        finally:
            close_old_connections()

    return await sync_to_async(work, thread_sensitive=False)()


def bearer(request: HttpRequest) -> str | None:
    """The key of an ``Authorization: Bearer <key>`` header, else ``None``."""
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


View = Callable[..., Awaitable[JsonResponse]]


def agent_endpoint(method: str) -> Callable[[View], View]:
    """Wrap an async agent view ``view(request, key, ...)``: method, bearer key, JSON errors.

    Other methods get 405 with ``Allow``, no key 401 ``authentication_required``,
    a wrong or revoked key 401 ``invalid_key``, a :class:`RequestError` 400 with
    its code, a database outage 503 ``database_unavailable``.
    """

    def decorate(view: View) -> View:
        @wraps(view)
        async def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> JsonResponse:
            if request.method != method:
                response = error_response(
                    errors.METHOD_NOT_ALLOWED,
                    f"This endpoint accepts only {method}.",
                    status=405,
                )
                response["Allow"] = method
                return response
            raw = bearer(request)
            if raw is None:
                response = error_response(
                    errors.AUTHENTICATION_REQUIRED,
                    "Send the agent key as 'Authorization: Bearer <key>'.",
                    status=401,
                )
                response["WWW-Authenticate"] = 'Bearer realm="toolgate"'
                return response
            try:
                key = await run(agentkeys.verify, raw)
                if key is None:
                    response = error_response(errors.INVALID_KEY, status=401)
                    response["WWW-Authenticate"] = 'Bearer realm="toolgate", error="invalid_token"'
                    return response
                return await view(request, key, *args, **kwargs)
            except RequestError as exc:
                return error_response(exc.code, exc.detail, status=400)
            except DatabaseError as exc:
                logger.warning("approvals: database unavailable in %s: %s", view.__name__, exc)
                response = error_response(errors.DATABASE_UNAVAILABLE, status=503)
                response["Retry-After"] = "1"
                return response

        return csrf_exempt(wrapper)

    return decorate
