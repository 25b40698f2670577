"""What clients send: reading and checking a person's decision, the same for HTTP and WebSocket.

Both entry points parse the client's JSON with :func:`parse_json`, check it
with :func:`parse_decision`, and decide it with :func:`decide_request`;
anything wrong raises :class:`~approvals.errors.RequestError` with a stable
``code`` (:mod:`approvals.errors`) and a sentence for a person. Nothing is
decided until a request has passed every check.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .conf import setting
from .decisions import Outcome, decide
from .errors import (
    INVALID_DECISION,
    INVALID_FIELD,
    INVALID_JSON,
    MISSING_FIELD,
    TOO_LARGE,
    RequestError,
)
from .models import ANSWER_STATUS, REMEMBER_SCOPES, Approval, status_for_answer


@dataclass(frozen=True)
class DecisionRequest:
    approval_id: str
    decision: str
    session_id: str | None
    reason: str
    remember: str | None
    #: A person's edit of the call's arguments (only with ``allow``); ``None``: as proposed.
    arguments: dict | None = None


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


def check_text(value: str, what: str) -> None:
    """Refuse text no database stores: a NUL, or a lone surrogate (not UTF-8)."""
    if "\x00" in value:
        raise RequestError(INVALID_FIELD, f"{what} contains a NUL character.")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise RequestError(
            INVALID_FIELD, f"{what} contains a lone surrogate, which is not valid Unicode text."
        ) from None


def string_field(data: dict, name: str, *, required: bool, limit: int) -> str | None:
    """The string field ``name`` of a request body, checked; ``None`` when absent or null
    and not ``required``. Every problem raises :class:`RequestError` with a code."""
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
    check_text(value, f"The field {name!r}")
    return value


def parse_decision(data: dict) -> DecisionRequest:
    """Check a decision request's fields; raise :class:`RequestError` on the first problem."""
    approval_id = string_field(
        data, "approval_id", required=True, limit=Approval.limit("approval_id")
    )
    decision = string_field(data, "decision", required=True, limit=16)
    if decision not in ANSWER_STATUS:
        raise RequestError(INVALID_DECISION, 'The field "decision" must be "allow" or "deny".')
    session_id = string_field(
        data, "session_id", required=False, limit=Approval.limit("session_id")
    )
    reason = string_field(data, "reason", required=False, limit=setting("MAX_REASON_LENGTH")) or ""
    remember = string_field(data, "remember", required=False, limit=16)
    if remember is not None and remember not in REMEMBER_SCOPES:
        raise RequestError(
            INVALID_FIELD, 'The field "remember" must be "session", "always" or absent.'
        )
    arguments = _edited_arguments(data, decision)
    return DecisionRequest(approval_id, decision, session_id, reason, remember, arguments)


def _edited_arguments(data: dict, decision: str) -> dict | None:
    value = data.get("arguments")
    if value is None:
        return None
    if not isinstance(value, dict):
        raise RequestError(INVALID_FIELD, 'The field "arguments" must be a JSON object.')
    if decision != "allow":
        raise RequestError(
            INVALID_FIELD, 'The field "arguments" goes only with "decision": "allow".'
        )
    for text in _strings(value):
        check_text(text, 'The field "arguments"')
    return value


def _strings(value: Any):
    """Every key and string inside a JSON value (its nesting is bounded by the body size)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            yield from item.keys()
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def decide_request(ask: DecisionRequest, user: Any, via: str) -> Outcome:
    """Decide a checked request on behalf of ``user``, who must be allowed to see the call."""
    return decide(
        ask.approval_id,
        status_for_answer(ask.decision),
        via=via,
        by=user,
        viewer=user,
        reason=ask.reason,
        session_id=ask.session_id,
        remember=ask.remember,
        edited_arguments=ask.arguments,
    )


def session_filter(value: str | None) -> str | None:
    """A ``?session_id=`` filter: ``None`` when absent or empty; ``RequestError`` when it
    cannot name a session (too long, or holding a NUL)."""
    if not value:
        return None
    limit = Approval.limit("session_id")
    if len(value) > limit:
        raise RequestError(
            INVALID_FIELD, f"The parameter 'session_id' is longer than {limit} characters."
        )
    check_text(value, "The parameter 'session_id'")
    return value
