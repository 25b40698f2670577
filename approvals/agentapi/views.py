"""The agent endpoints: gate a call, read (and wait for) it, cancel it, report it ran.

Every view is ``async`` (see :mod:`.auth`); a call belongs to the key's user,
and another user's call is "not found" by the same single query that finds
none, so the two cost the same.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.http import HttpRequest, JsonResponse
from django.utils import timezone

from .. import errors, gate, listener
from ..decisions import decide
from ..execution import EXECUTED, NOT_FOUND, record_execution
from ..jsonapi import error_response, read_body
from ..models import AgentKey, Approval, Status, Via
from . import parse, waits
from .auth import agent_endpoint, run
from .objects import object_for


def _not_found() -> JsonResponse:
    return error_response(
        errors.NOT_FOUND, "No tool call with that approval_id is yours.", status=404
    )


# -- POST approvals -----------------------------------------------------------


def _gate(key: AgentKey, ask: parse.GateRequest) -> tuple[int, dict | None]:
    """Gate ``ask`` for the key's user; ``(201|200, object)`` or ``(409, None)``."""
    approval_id = ask.approval_id or gate.new_approval_id()
    if ask.approval_id is not None:
        known = _owner(approval_id)
        if known is not None:
            return _retry(key, ask, approval_id, known)
    try:
        slot = gate.begin_tool_decision(
            ask.session_id,
            approval_id,
            tool_name=ask.tool_name,
            arguments=ask.arguments,
            user=key.user,
            tool_call_id=ask.tool_call_id,
            timeout=ask.timeout,
            description=ask.description,
            editable=ask.editable,
            arguments_schema=ask.arguments_schema,
            agent_key=key,
        )
    except ValueError as exc:
        known = _owner(approval_id)
        if known is not None:  # a retry racing its first attempt, or another's id
            return _retry(key, ask, approval_id, known)
        raise errors.RequestError(errors.INVALID_FIELD, str(exc)) from None
    # An HTTP agent has no process here: the row names no waiter (so no process
    # lease judges it); the agent's own sightings keep it alive instead.
    listener.get_listener().unregister(slot)
    Approval.objects.filter(approval_id=approval_id).update(waiter="", agent_seen_at=timezone.now())
    known = _owner(approval_id)
    if known is None or known[0] != key.user_id:  # lost a race to another user
        return 409, None
    return 201, object_for(approval_id, key.user_id)


def _owner(approval_id: str) -> tuple[Any, str] | None:
    row = Approval.objects.filter(approval_id=approval_id).values("user_id", "session_id").first()
    return None if row is None else (row["user_id"], row["session_id"])


def _retry(key: AgentKey, ask: parse.GateRequest, approval_id: str, known: tuple) -> tuple:
    if known != (key.user_id, ask.session_id):
        return 409, None
    _seen(approval_id, timezone.now())
    return 200, object_for(approval_id, key.user_id)


@agent_endpoint("POST")
async def create(request: HttpRequest, key: AgentKey) -> JsonResponse:
    """Gate one call for the key's user (201), or report the same call again (200)."""
    ask = parse.parse_gate(read_body(request))
    status, body = await run(_gate, key, ask)
    if body is None:
        return error_response(errors.APPROVAL_ID_IN_USE, status=409)
    return JsonResponse(body, status=status)


# -- GET approvals/<id>?wait= ---------------------------------------------------


def _seen(approval_id: str, until: Any) -> None:
    Approval.objects.filter(approval_id=approval_id, status=Status.PENDING).update(
        agent_seen_at=until
    )


def _look(key: AgentKey, approval_id: str, seconds: float) -> dict | None:
    """The call's object, expiring it first if its deadline passed; marks the agent seen.

    While a wait is open the sighting is dated to the wait's end, so no process
    judges the call abandoned while some process holds a wait for it.
    """
    body = object_for(approval_id, key.user_id)
    if body is None or body["status"] != Status.PENDING:
        return body
    now = timezone.now()
    if Approval.objects.filter(approval_id=approval_id, expires_at__lte=now).exists():
        decide(approval_id, Status.EXPIRED, via=Via.TIMEOUT)
        return object_for(approval_id, key.user_id)
    _seen(approval_id, now + timedelta(seconds=seconds))
    return body


def _left(body: dict, seconds: float) -> float:
    expires = Approval._meta.get_field("expires_at").to_python(body["expires_at"])
    return max(0.0, min(seconds, (expires - timezone.now()).total_seconds() + 0.05))


@agent_endpoint("GET")
async def detail(request: HttpRequest, key: AgentKey, approval_id: str) -> JsonResponse:
    """The call's object; with ``wait``, once it is decided or ``wait`` seconds pass."""
    seconds = parse.parse_wait(request.GET.get("wait"))
    if not parse.check_approval_id(approval_id):
        return _not_found()
    if seconds == 0:
        body = await run(_look, key, approval_id, 0.0)
        return _not_found() if body is None else JsonResponse(body)
    slot = await run(waits.acquire, approval_id)  # before the read: no decision slips by
    try:
        body = await run(_look, key, approval_id, seconds)
        if body is None:
            return _not_found()
        if body["status"] == Status.PENDING:
            await waits.until_decided(slot, _left(body, seconds))
            body = await run(_look, key, approval_id, 0.0)
        return JsonResponse(body)
    finally:
        waits.release(slot)


# -- POST approvals/<id>/cancel ---------------------------------------------------


def _cancel(key: AgentKey, approval_id: str) -> tuple[int, dict | None, str]:
    if _owner(approval_id) is None or _owner(approval_id)[0] != key.user_id:
        return 404, None, ""
    listener.get_listener()  # this process announces the decision: its listener runs
    outcome = decide(approval_id, Status.CANCELLED, via=Via.CANCEL)
    if outcome.won:
        return 200, object_for(approval_id, key.user_id), ""
    if outcome.error == errors.ALREADY_DECIDED:
        return 409, None, outcome.status
    return 404, None, ""


@agent_endpoint("POST")
async def cancel(request: HttpRequest, key: AgentKey, approval_id: str) -> JsonResponse:
    """Cancel a pending call of the key's user."""
    read_body(request)
    if not parse.check_approval_id(approval_id):  # no database stores it: no such call
        return _not_found()
    status, body, current = await run(_cancel, key, approval_id)
    if status == 409:
        return error_response(
            errors.ALREADY_DECIDED,
            f"That tool call is no longer pending: it is {current}.",
            status=409,
            extra={"status": current},
        )
    return _not_found() if body is None else JsonResponse(body)


# -- POST approvals/<id>/executed ---------------------------------------------------


def _executed(key: AgentKey, approval_id: str, ok: bool, summary: str) -> tuple:
    result = record_execution(approval_id, ok, summary, user_id=key.user_id)
    return result, object_for(approval_id, key.user_id)


@agent_endpoint("POST")
async def executed(request: HttpRequest, key: AgentKey, approval_id: str) -> JsonResponse:
    """Record that an allowed call of the key's user ran (once)."""
    ok, summary = parse.parse_executed(read_body(request))
    if not parse.check_approval_id(approval_id):
        return _not_found()
    result, body = await run(_executed, key, approval_id, ok, summary)
    if result == EXECUTED and body is not None:
        return JsonResponse(body)
    if result == NOT_FOUND or body is None:
        return _not_found()
    return error_response(result, status=409, extra={"status": body["status"]})
