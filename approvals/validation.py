"""Checking a person's decision request, the same way for HTTP and WebSocket.

Both entry points parse the client's JSON with :func:`parse_json` and check it
with :func:`parse_decision`; anything wrong raises :class:`RequestError` with a
stable ``code`` and a sentence for a person. Nothing is decided until a request
has passed every check.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .conf import setting
from .decisions import REMEMBER_SCOPES

#: Error codes shared by the HTTP endpoint and the WebSocket consumer.
INVALID_JSON = "invalid_json"
MISSING_FIELD = "missing_field"
INVALID_FIELD = "invalid_field"
INVALID_DECISION = "invalid_decision"
TOO_LARGE = "too_large"
AUTHENTICATION_REQUIRED = "authentication_required"
NOT_FOUND = "not_found"
ALREADY_DECIDED = "already_decided"
UNKNOWN_TYPE = "unknown_type"
METHOD_NOT_ALLOWED = "method_not_allowed"
CSRF_FAILED = "csrf_failed"
DATABASE_UNAVAILABLE = "database_unavailable"

ERROR_DETAILS = {
    AUTHENTICATION_REQUIRED: "Sign in to see or decide tool calls.",
    NOT_FOUND: "No pending tool call with that approval_id is visible to you.",
    ALREADY_DECIDED: "That tool call was already decided; the first decision stands.",
    METHOD_NOT_ALLOWED: "This endpoint accepts only POST.",
    CSRF_FAILED: "The CSRF check failed: send the csrftoken cookie's value in X-CSRFToken.",
    DATABASE_UNAVAILABLE: "The database could not be reached, so nothing was decided. Try again.",
}


class RequestError(ValueError):
    """A client mistake: ``code`` is stable, ``detail`` is for a person."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


@dataclass(frozen=True)
class DecisionRequest:
    approval_id: str
    decision: str
    session_id: str | None
    reason: str
    remember: str | None


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict:
    seen: dict = {}
    for key, value in pairs:
        if key in seen:
            raise RequestError(INVALID_JSON, f"The JSON object repeats the key {key!r}.")
        seen[key] = value
    return seen


def parse_json(raw: bytes | str) -> dict:
    """Parse a request body or frame into a JSON object, within the size limit."""
    limit = setting("MAX_BODY_BYTES")
    size = len(raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw)
    if size > limit:
        raise RequestError(TOO_LARGE, f"The request is {size} bytes; the limit is {limit} bytes.")
    try:
        data = json.loads(raw, object_pairs_hook=_no_duplicate_keys)
    except RequestError:
        raise
    except (ValueError, RecursionError, UnicodeDecodeError):
        raise RequestError(INVALID_JSON, "The request body is not valid JSON.") from None
    if not isinstance(data, dict):
        raise RequestError(INVALID_JSON, "The request body must be a JSON object.")
    return data


def _string(data: dict, name: str, *, required: bool, limit: int) -> str | None:
    if name not in data or (not required and data[name] is None):
        if required:
            raise RequestError(MISSING_FIELD, f"The field {name!r} is required.")
        return None
    value = data[name]
    if not isinstance(value, str):
        raise RequestError(INVALID_FIELD, f"The field {name!r} must be a string.")
    if required and not value:
        raise RequestError(INVALID_FIELD, f"The field {name!r} must not be empty.")
    if len(value) > limit:
        raise RequestError(INVALID_FIELD, f"The field {name!r} is longer than {limit} characters.")
    if "\x00" in value:
        raise RequestError(INVALID_FIELD, f"The field {name!r} contains a NUL character.")
    return value


def parse_decision(data: dict) -> DecisionRequest:
    """Check a decision request's fields; raise :class:`RequestError` on the first problem."""
    approval_id = _string(data, "approval_id", required=True, limit=128)
    decision = _string(data, "decision", required=True, limit=16)
    if decision not in ("allow", "deny"):
        raise RequestError(INVALID_DECISION, 'The field "decision" must be "allow" or "deny".')
    session_id = _string(data, "session_id", required=False, limit=255)
    reason = _string(data, "reason", required=False, limit=setting("MAX_REASON_LENGTH")) or ""
    remember = _string(data, "remember", required=False, limit=16)
    if remember is not None and remember not in REMEMBER_SCOPES:
        raise RequestError(
            INVALID_FIELD, 'The field "remember" must be "session", "always" or absent.'
        )
    return DecisionRequest(approval_id, decision, session_id, reason, remember)
