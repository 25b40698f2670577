"""The JSON endpoints' common ground: one decorator for method, sign-in, CSRF and errors.

Every answer is JSON, errors included: a stable ``error`` code
(:mod:`approvals.errors`) and a ``detail`` sentence, never a login redirect or
an HTML error page.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import wraps
from typing import Any

from django.db import DatabaseError
from django.http import HttpRequest, JsonResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.views.decorators.csrf import csrf_exempt

from . import errors
from .conf import setting
from .errors import RequestError

logger = logging.getLogger("approvals.views")


def error_response(
    code: str, detail: str | None = None, *, status: int, extra: dict | None = None
) -> JsonResponse:
    """A JSON error: ``{**extra, "error": code, "detail": sentence}`` with ``status``."""
    body = dict(extra or {})
    body["error"] = code
    body["detail"] = detail or errors.detail_for(code)
    return JsonResponse(body, status=status)


def _csrf_failure(request: HttpRequest) -> JsonResponse | None:
    """Django's own CSRF check (it logs the failure), answered in JSON."""
    check = CsrfViewMiddleware(lambda request: None)
    check.process_request(request)
    if check.process_view(request, None, (), {}) is None:
        return None
    return error_response(
        errors.CSRF_FAILED, status=403, extra=getattr(request, "_approvals_error_extra", None)
    )


def json_endpoint(method: str, *, extra: dict | None = None, csrf: bool = False) -> Callable:
    """Wrap a view: only ``method``, signed-in users, CSRF when ``csrf``; errors in JSON.

    Other methods get 405 with an ``Allow`` header, anonymous callers 401, a
    failed CSRF check 403 ``csrf_failed``, and a :class:`RequestError` raised by
    the view 400 with its code. ``extra`` is merged into every error body (the
    decision endpoint adds ``"resolved": false``).
    """

    def decorate(view: Callable) -> Callable:
        @wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> JsonResponse:
            request._approvals_error_extra = extra
            if request.method != method:
                response = error_response(
                    errors.METHOD_NOT_ALLOWED,
                    f"This endpoint accepts only {method}.",
                    status=405,
                    extra=extra,
                )
                response["Allow"] = method
                return response
            user = getattr(request, "user", None)  # None without AuthenticationMiddleware
            if user is None or not user.is_authenticated:
                return error_response(errors.AUTHENTICATION_REQUIRED, status=401, extra=extra)
            try:
                if csrf:
                    _check_declared_length(request)
                    failure = _csrf_failure(request)
                    if failure is not None:
                        return failure
                return view(request, *args, **kwargs)
            except RequestError as exc:
                return error_response(exc.code, exc.detail, status=400, extra=extra)
            except DatabaseError as exc:
                # Nothing was decided (the decision's transaction rolled back): say so.
                logger.warning("approvals: database unavailable in %s: %s", view.__name__, exc)
                response = error_response(errors.DATABASE_UNAVAILABLE, status=503, extra=extra)
                response["Retry-After"] = "1"
                return response

        # The CSRF check runs inside, so that its failure is answered in JSON (and
        # a POST to a read-only endpoint gets its 405, not the middleware's 403).
        return csrf_exempt(wrapper)

    return decorate


def _check_declared_length(request: HttpRequest) -> None:
    limit = setting("MAX_BODY_BYTES")
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        raise RequestError(errors.INVALID_FIELD, "The Content-Length header is not a number.")
    if declared > limit:
        raise RequestError(
            errors.TOO_LARGE,
            f"The request is {declared} bytes; the limit is {limit} bytes.",
        )


def read_body(request: HttpRequest) -> bytes:
    """The request body, reading at most one byte past the limit (so never unbounded)."""
    limit = setting("MAX_BODY_BYTES")
    raw = request.read(limit + 1)
    if len(raw) > limit:
        raise RequestError(errors.TOO_LARGE, f"The request is over the limit of {limit} bytes.")
    return raw
