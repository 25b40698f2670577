"""Reading what agents send: the gate request, ``wait``, the execution report.

Anything wrong raises :class:`~approvals.errors.RequestError` with a stable
code before anything is written. Text no database stores (a NUL, a lone
surrogate) is refused anywhere in the body, keys of nested objects included.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..errors import INVALID_FIELD, MISSING_FIELD, RequestError
from ..gating import MAX_DESCRIPTION_LENGTH
from ..models import Approval
from ..payloads import check_text, parse_json, string_field

#: The longest ``wait`` (seconds) a GET may ask for.
MAX_WAIT = 60.0
#: The longest execution ``summary``.
MAX_SUMMARY_LENGTH = 10_000
_MAX_DEPTH = 64


@dataclass(frozen=True)
class GateRequest:
    session_id: str
    tool_name: str
    arguments: dict
    tool_call_id: str
    approval_id: str | None
    timeout: float | None
    description: str
    editable: bool
    arguments_schema: dict | None


def _check_tree(value: Any, what: str, depth: int = 0) -> None:
    if depth > _MAX_DEPTH:
        raise RequestError(INVALID_FIELD, f"{what} is nested too deeply.")
    if isinstance(value, str):
        check_text(value, what)
    elif isinstance(value, dict):
        for key, item in value.items():
            check_text(key, what)
            _check_tree(item, what, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _check_tree(item, what, depth + 1)


def _text(data: dict, name: str, limit: int, *, required: bool = False) -> str:
    if required and data.get(name) is None:
        raise RequestError(MISSING_FIELD, f"The field {name!r} is required.")
    return string_field(data, name, required=required, limit=limit) or ""


def _object(data: dict, name: str) -> dict | None:
    value = data.get(name)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise RequestError(INVALID_FIELD, f"The field {name!r} must be a JSON object.")
    _check_tree(value, f"The field {name!r}")
    return value


def _timeout(data: dict) -> float | None:
    value = data.get("timeout")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RequestError(INVALID_FIELD, "The field 'timeout' must be a number of seconds.")
    if not math.isfinite(value) or value <= 0 or value > 366 * 86400:
        raise RequestError(
            INVALID_FIELD, "The field 'timeout' must be more than 0 and at most a year."
        )
    return float(value)


def parse_gate(raw: bytes) -> GateRequest:
    """Check a ``POST approvals`` body."""
    data = parse_json(raw)
    editable = data.get("editable", False)
    if editable is None:
        editable = False
    if not isinstance(editable, bool):
        raise RequestError(INVALID_FIELD, "The field 'editable' must be true or false.")
    approval_id = _text(data, "approval_id", Approval.limit("approval_id")) or None
    return GateRequest(
        session_id=_text(data, "session_id", Approval.limit("session_id"), required=True),
        tool_name=_text(data, "tool_name", Approval.limit("tool_name"), required=True),
        arguments=_object(data, "arguments") or {},
        tool_call_id=_text(data, "tool_call_id", Approval.limit("tool_call_id")),
        approval_id=approval_id,
        timeout=_timeout(data),
        description=_text(data, "description", MAX_DESCRIPTION_LENGTH),
        editable=editable,
        arguments_schema=_object(data, "arguments_schema"),
    )


def parse_wait(value: str | None) -> float:
    """``?wait=``: seconds from 0 to :data:`MAX_WAIT` (absent: 0)."""
    if value is None or value == "":
        return 0.0
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or not 0 <= seconds <= MAX_WAIT:
        raise RequestError(
            INVALID_FIELD, f"The parameter 'wait' must be a number from 0 to {MAX_WAIT:g}."
        )
    return seconds


def parse_executed(raw: bytes) -> tuple[bool, str]:
    """Check a ``POST approvals/<id>/executed`` body (empty: ``ok`` true, no summary)."""
    data = parse_json(raw) if raw.strip() else {}
    ok = data.get("ok", True)
    if ok is None:
        ok = True
    if not isinstance(ok, bool):
        raise RequestError(INVALID_FIELD, "The field 'ok' must be true or false.")
    return ok, _text(data, "summary", MAX_SUMMARY_LENGTH)


def check_approval_id(value: str) -> bool:
    """Whether a path's approval id could name a call (else it is simply not found)."""
    return 0 < len(value) <= Approval.limit("approval_id") and value.isprintable()
