"""The JSON endpoints: decide a call, list pending calls, manage one's own rules.

Every answer is JSON, errors included: a stable ``error`` code and a ``detail``
sentence, never a login redirect or an HTML error page. Decisions go through
:func:`approvals.decisions.decide` like everything else. The views are plain
synchronous views; under ASGI Django runs them in its thread pool.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from functools import cache, wraps
from pathlib import Path
from typing import Any

from django.db import DatabaseError
from django.db.models import Q
from django.http import HttpRequest, JsonResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt, ensure_csrf_cookie

from . import decisions, events, validation
from .conf import setting
from .models import Rule, Status, Via
from .validation import RequestError

csrf_logger = logging.getLogger("django.security.csrf")
logger = logging.getLogger("approvals.views")
OPENAPI_PATH = Path(__file__).with_name("openapi.json")
RULE_FIELDS = (
    "id",
    "session_id",
    "tool_name",
    "arguments_match",
    "decision",
    "created_at",
    "expires_at",
    "note",
)


def error_response(
    code: str, detail: str | None = None, *, status: int, extra: dict | None = None
) -> JsonResponse:
    """A JSON error: ``{**extra, "error": code, "detail": sentence}`` with ``status``."""
    body = dict(extra or {})
    body["error"] = code
    body["detail"] = detail or validation.ERROR_DETAILS.get(code, "The request failed.")
    return JsonResponse(body, status=status)


class _JsonCsrfCheck(CsrfViewMiddleware):
    """Django's own CSRF check, answering a failure in JSON instead of an HTML page."""

    def _reject(self, request: HttpRequest, reason: str) -> JsonResponse:
        csrf_logger.warning(
            "Forbidden (%s): %s",
            reason,
            request.path,
            extra={"status_code": 403, "request": request},
        )
        return error_response(
            validation.CSRF_FAILED,
            f"{validation.ERROR_DETAILS[validation.CSRF_FAILED]} ({reason})",
            status=403,
            extra=getattr(request, "_approvals_error_extra", None),
        )


def _csrf_failure(request: HttpRequest) -> JsonResponse | None:
    check = _JsonCsrfCheck(lambda request: None)
    check.process_request(request)
    return check.process_view(request, None, (), {})


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
                    validation.METHOD_NOT_ALLOWED,
                    f"This endpoint accepts only {method}.",
                    status=405,
                    extra=extra,
                )
                response["Allow"] = method
                return response
            user = getattr(request, "user", None)  # None without AuthenticationMiddleware
            if user is None or not user.is_authenticated:
                return error_response(validation.AUTHENTICATION_REQUIRED, status=401, extra=extra)
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
                response = error_response(validation.DATABASE_UNAVAILABLE, status=503, extra=extra)
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
        raise RequestError(validation.INVALID_FIELD, "The Content-Length header is not a number.")
    if declared > limit:
        raise RequestError(
            validation.TOO_LARGE,
            f"The request is {declared} bytes; the limit is {limit} bytes.",
        )


def read_body(request: HttpRequest) -> bytes:
    """The request body, reading at most one byte past the limit (so never unbounded)."""
    limit = setting("MAX_BODY_BYTES")
    raw = request.body if hasattr(request, "_body") else request.read(limit + 1)
    if len(raw) > limit:
        raise RequestError(validation.TOO_LARGE, f"The request is over the limit of {limit} bytes.")
    return raw


@json_endpoint("POST", extra={"resolved": False}, csrf=True)
def tool_confirm(request: HttpRequest) -> JsonResponse:
    """Allow or deny one pending call on behalf of the signed-in user."""
    ask = validation.parse_decision(validation.parse_json(read_body(request)))
    outcome = decisions.decide(
        ask.approval_id,
        decisions.status_for_answer(ask.decision),
        via=Via.WEB,
        by=request.user,
        viewer=request.user,
        reason=ask.reason,
        session_id=ask.session_id,
        remember=ask.remember,
    )
    if outcome.won:
        body = {"resolved": True, "approval_id": ask.approval_id, "status": outcome.status}
        if ask.remember:
            body["remembered"] = ask.remember
        return JsonResponse(body)
    if outcome.error == validation.ALREADY_DECIDED:
        return error_response(
            validation.ALREADY_DECIDED,
            f"That tool call is no longer pending: it is {outcome.status}.",
            status=409,
            extra={"resolved": False, "status": outcome.status},
        )
    return error_response(validation.NOT_FOUND, status=404, extra={"resolved": False})


def _session_filter(request: HttpRequest) -> str | None:
    session_id = request.GET.get("session_id") or None
    if session_id is not None and len(session_id) > 255:
        raise RequestError(
            validation.INVALID_FIELD, "The parameter 'session_id' is longer than 255 characters."
        )
    return session_id


@ensure_csrf_cookie
@json_endpoint("GET")
def tool_approvals(request: HttpRequest) -> JsonResponse:
    """The pending, unexpired calls the signed-in user may decide, oldest first.

    The response also sets the ``csrftoken`` cookie that a client echoes in
    ``X-CSRFToken`` when it posts a decision.
    """
    session_id = _session_filter(request)
    qs = decisions.visible_to(request.user).filter(
        status=Status.PENDING, expires_at__gt=timezone.now()
    )
    if session_id is not None:
        qs = qs.filter(session_id=session_id)
    rows = qs.order_by("created_at", "pk").values(*events.PENDING_FIELDS)
    pending = [events.pending_item(row) for row in rows[: setting("PENDING_LIMIT")]]
    return JsonResponse({"pending": pending})


def _rule_item(row: dict) -> dict:
    item = dict(row)
    item["created_at"] = events.iso(item["created_at"])
    item["expires_at"] = events.iso(item["expires_at"])
    return item


@json_endpoint("GET")
def rule_list(request: HttpRequest) -> JsonResponse:
    """The signed-in user's own unexpired rules, newest first."""
    live = Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now())
    rows = (
        Rule.objects.filter(live, user_id=request.user.pk)
        .order_by("-created_at", "-pk")
        .values(*RULE_FIELDS)
    )
    return JsonResponse({"rules": [_rule_item(row) for row in rows]})


@json_endpoint("POST", extra={"revoked": False}, csrf=True)
def rule_revoke(request: HttpRequest, pk: str) -> JsonResponse:
    """Delete one of the signed-in user's own rules; anyone else's is "not found"."""
    deleted = 0
    if pk.isascii() and pk.isdigit() and len(pk) < 19:
        deleted, _ = Rule.objects.filter(pk=int(pk), user_id=request.user.pk).delete()
    if not deleted:
        return error_response(
            validation.NOT_FOUND,
            "No rule with that id is yours.",
            status=404,
            extra={"revoked": False},
        )
    return JsonResponse({"revoked": True, "id": int(pk)})


@cache
def _openapi_document() -> dict:
    return json.loads(OPENAPI_PATH.read_text(encoding="utf-8"))


@csrf_exempt
def openapi(request: HttpRequest) -> JsonResponse:
    """The OpenAPI 3.1 document of these endpoints, with the prefix they are mounted at."""
    if request.method not in ("GET", "HEAD"):
        response = error_response(
            validation.METHOD_NOT_ALLOWED, "This endpoint accepts only GET.", status=405
        )
        response["Allow"] = "GET, HEAD"
        return response
    document = dict(_openapi_document())
    prefix = request.path[: -len("openapi.json")].rstrip("/")
    document["servers"] = [{"url": prefix or "/"}]
    return JsonResponse(document, json_dumps_params={"indent": 1})
