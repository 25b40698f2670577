"""The JSON endpoints: decide a call, list pending calls, manage one's own rules.

Decisions go through :func:`approvals.payloads.decide_request` like the
WebSocket's. The views are plain synchronous views; under ASGI Django runs
them in its thread pool.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt, ensure_csrf_cookie

from . import errors, events, listener, payloads
from .conf import setting
from .jsonapi import error_response, json_endpoint, read_body
from .models import Approval, Rule, Via

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


@json_endpoint("POST", extra={"resolved": False}, csrf=True)
def tool_confirm(request: HttpRequest) -> JsonResponse:
    """Allow or deny one pending call on behalf of the signed-in user."""
    ask = payloads.parse_decision(payloads.parse_json(read_body(request)))
    listener.get_listener()  # this process will announce the decision: its listener runs
    outcome = payloads.decide_request(ask, request.user, Via.WEB)
    if outcome.won:
        body = {"resolved": True, "approval_id": ask.approval_id, "status": outcome.status}
        if ask.remember:
            body["remembered"] = ask.remember
        return JsonResponse(body)
    if outcome.error == errors.ALREADY_DECIDED:
        return error_response(
            errors.ALREADY_DECIDED,
            f"That tool call is no longer pending: it is {outcome.status}.",
            status=409,
            extra={"resolved": False, "status": outcome.status},
        )
    return error_response(errors.NOT_FOUND, status=404, extra={"resolved": False})


@ensure_csrf_cookie
@json_endpoint("GET")
def tool_approvals(request: HttpRequest) -> JsonResponse:
    """The pending, unexpired calls the signed-in user may decide, oldest first.

    The response also sets the ``csrftoken`` cookie that a client echoes in
    ``X-CSRFToken`` when it posts a decision.
    """
    qs = (
        Approval.objects.visible_to(request.user)
        .awaiting()
        .in_session(payloads.session_filter(request.GET.get("session_id")))
    )
    return JsonResponse({"pending": qs.pending_items(setting("PENDING_LIMIT"))})


@json_endpoint("GET")
def tool_approval(request: HttpRequest, approval_id: str) -> JsonResponse:
    """One call the signed-in user may see, with its full arguments and its status.

    Sockets carry arguments over ``PREVIEW_BYTES`` cut short; the page loads
    them whole from here. Another user's call is "not found", like an unknown id.
    """
    row = None
    if 0 < len(approval_id) <= Approval.limit("approval_id") and approval_id.isprintable():
        row = (
            Approval.objects.visible_to(request.user)
            .filter(approval_id=approval_id)
            .values(*events.PENDING_FIELDS, "status")
            .first()
        )
    if row is None:
        return error_response(
            errors.NOT_FOUND, "No tool call with that approval_id is yours.", status=404
        )
    return JsonResponse({**events.pending_item(row), "status": row["status"]})


def _rule_item(row: dict) -> dict:
    item = dict(row)
    item["created_at"] = events.iso(item["created_at"])
    item["expires_at"] = events.iso(item["expires_at"])
    return item


@json_endpoint("GET")
def rule_list(request: HttpRequest) -> JsonResponse:
    """The signed-in user's own unexpired rules, newest first."""
    rows = (
        Rule.objects.live()
        .filter(user_id=request.user.pk)
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
            errors.NOT_FOUND,
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
            errors.METHOD_NOT_ALLOWED, "This endpoint accepts only GET.", status=405
        )
        response["Allow"] = "GET, HEAD"
        return response
    document = dict(_openapi_document())
    prefix = request.path[: -len("openapi.json")].rstrip("/")
    document["servers"] = [{"url": prefix or "/"}]
    return JsonResponse(document, json_dumps_params={"indent": 1})
