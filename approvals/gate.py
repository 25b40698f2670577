"""The agent-facing API: pause one tool call until a person answers.

An agent loop calls :func:`begin_tool_decision` before it runs a tool, tells
its client about the call, then :func:`wait_tool_decision` (or the async
twins). The answer is ``"allow"`` or ``"deny"``; on anything but allow, feed
:func:`denial_message` to the model as the tool result. Decisions can be made
from any process of the project (web page, admin, HTTP, code) and reach the
waiter wherever it runs.
"""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

from asgiref.sync import sync_to_async

from . import execution
from .decisions import decide
from .execution import ToolDecision
from .gating import (
    check_context,
    check_details,
    decision_timeout,
    finish,
    gate_call,
    in_background,
    limited_sync,
    remaining,
)
from .listener import get_listener
from .models import Approval, Status, Via, answer_for_status, status_for_answer
from .waiting import INTERRUPTED, Slot, on_set, settle

__all__ = [
    "TOOL_REJECTED_MESSAGE",
    "Slot",
    "ToolDecision",
    "aabort_tool_decision",
    "abegin_tool_decision",
    "abort_tool_decision",
    "arequest_tool_decision",
    "aget_decision",
    "amark_executed",
    "aresolve_tool_decision",
    "await_tool_decision",
    "begin_tool_decision",
    "denial_message",
    "get_decision",
    "mark_executed",
    "new_approval_id",
    "release_tool_decision",
    "request_tool_decision",
    "resolve_tool_decision",
    "wait_tool_decision",
]

#: The tool result fed to the model when a person denies a call.
TOOL_REJECTED_MESSAGE = "The user declined to run this tool call."
EXPIRED_MESSAGE = "Nobody answered in time, so this tool call was not run."
CANCELLED_MESSAGE = "This tool call was cancelled before anyone answered, so it was not run."
ABANDONED_MESSAGE = "The process waiting for this tool call stopped, so it was not run."


def new_approval_id() -> str:
    """A new unguessable, URL-safe approval id (at least 186 random bits).

    It starts with a letter or digit, so no tool reads it as an option
    (``-x…``) or a spreadsheet as a formula.
    """
    while True:
        token = secrets.token_urlsafe(24)
        if token[0].isalnum():
            return token


def begin_tool_decision(
    session_id: str,
    approval_id: str,
    *,
    tool_name: str = "",
    arguments: dict | None = None,
    user: Any = None,
    tool_call_id: str = "",
    timeout: float | None = None,
    description: str = "",
    editable: bool = False,
    arguments_schema: dict | None = None,
    agent_key: Any = None,
) -> Slot:
    """Gate one call: register the waiter, write the pending row, then announce it.

    The slot exists before ``tool_start`` is published, so a decision arriving
    at any moment after is never lost. A matching rule answers at once (the row
    is written already decided). Calling again with an existing ``approval_id``
    of the same session resumes it: the slot gets the recorded outcome, or
    waits for it if the call is still pending.

    ``description`` (why the agent wants the call, at most 2,000 characters) is
    shown on the card; ``editable=True`` promises that the caller runs whatever
    arguments the person approves, which must satisfy ``arguments_schema`` (a
    JSON Schema) when given. ``agent_key`` records the agent key a call gated
    over HTTP came with.
    """
    check_details(session_id, approval_id, tool_name, tool_call_id, arguments)
    check_context(description, editable, arguments_schema)
    seconds = decision_timeout(timeout)
    listener = get_listener()
    listener.ensure_lease()
    details = {
        "approval_id": approval_id,
        "session_id": session_id,
        "user_id": getattr(user, "pk", user),
        "tool_name": tool_name,
        "tool_call_id": tool_call_id,
        "arguments": {} if arguments is None else arguments,
        "description": description,
        "editable": editable,
        "arguments_schema": arguments_schema,
        "agent_key_id": getattr(agent_key, "pk", agent_key),
    }
    owner = user.get_username() if hasattr(user, "get_username") else None
    return gate_call(listener, details, seconds, owner)


def wait_tool_decision(
    slot: Slot,
    approval_id: str,
    cancel_event: Any = None,
    timeout: float | None = None,
) -> str:
    """Block until the call is decided; return ``"allow"`` or ``"deny"``.

    A timeout records ``expired`` and a set ``cancel_event`` records
    ``cancelled`` (both answer ``"deny"``) unless a decision won first, in which
    case the winner's answer is returned. The slot is always removed.
    """
    try:
        limit = remaining(slot, timeout)
        remove_hook = on_set(cancel_event, slot.interrupt)
        try:
            outcome = slot.wait(limit)
        finally:
            remove_hook()
        return answer_for_status(finish(slot, approval_id, outcome))
    finally:
        get_listener().unregister(slot)


def request_tool_decision(
    session_id: str,
    approval_id: str,
    cancel_event: Any = None,
    timeout: float | None = None,
    **details: Any,
) -> str:
    """Gate a call and wait for its answer in one step (begin + wait)."""
    slot = begin_tool_decision(session_id, approval_id, timeout=timeout, **details)
    return wait_tool_decision(slot, approval_id, cancel_event)


def abort_tool_decision(slot: Slot, approval_id: str) -> None:
    """The caller gave up between begin and wait: record ``cancelled``, remove the slot."""
    try:
        if slot.status is None:
            decide(approval_id, Status.CANCELLED, via=Via.CANCEL)
    finally:
        get_listener().unregister(slot)


def release_tool_decision(slot: Slot, approval_id: str) -> None:
    """Leave a pending call for later: drop this process's waiter but keep the row pending.

    For deferred flows, where the agent run stops and a later run reads the
    outcome. The row names no waiting process any more, so the sweep does not
    mark it ``abandoned`` when this process goes away; it still expires at
    ``expires_at``.
    """
    get_listener().unregister(slot)
    Approval.objects.filter(approval_id=approval_id, status=Status.PENDING).update(waiter="")


def resolve_tool_decision(
    approval_id: str,
    decision: str,
    session_id: str | None = None,
    *,
    user: Any = None,
    via: str = "api",
    reason: str = "",
    arguments: dict | None = None,
) -> bool:
    """Decide a pending call; ``True`` only for the call whose decision won.

    ``False`` for an unknown id, a call already decided or expired, or a
    ``session_id`` that does not match. A ``decision`` other than ``"allow"`` or
    ``"deny"`` raises ``ValueError`` and changes nothing. ``arguments`` (with
    ``"allow"``) allows an editable call with a person's edit; a call not gated
    editable, or arguments failing its schema, raise ``ValueError``
    (:class:`~approvals.errors.RequestError`) and change nothing.
    """
    status = status_for_answer(decision)
    get_listener()  # this process will announce the decision: its listener runs
    outcome = decide(
        approval_id,
        status,
        via=via,
        by=user,
        reason=reason or "",
        session_id=session_id,
        edited_arguments=arguments,
    )
    return outcome.won


def denial_message(approval_id: str) -> str:
    """What to feed the model as the tool result when the call did not run."""
    row = Approval.objects.filter(approval_id=approval_id).values("status", "reason").first()
    if row is None:
        return TOOL_REJECTED_MESSAGE
    return message_for(row["status"], row["reason"])


def message_for(status: str, reason: str = "") -> str:
    """:func:`denial_message` for a call whose status and reason are already known."""
    if status == Status.EXPIRED:
        return EXPIRED_MESSAGE
    if status == Status.CANCELLED:
        return CANCELLED_MESSAGE
    if status == Status.ABANDONED:
        return ABANDONED_MESSAGE
    if status == Status.DENIED and reason:
        return f"{TOOL_REJECTED_MESSAGE} Reason: {reason}"
    return TOOL_REJECTED_MESSAGE


def get_decision(approval_id: str) -> ToolDecision:
    """The call's outcome as the agent needs it: whether to run it, with which arguments
    (the person's edit if any, else the proposal), or what to tell the model.

    Raises ``Approval.DoesNotExist`` for an unknown ``approval_id``.
    """
    row = execution.decision_row(approval_id)
    if row is None:
        raise Approval.DoesNotExist(f"no approval {approval_id!r}")
    message = None if row["status"] == Status.ALLOWED else denial_message(approval_id)
    return execution.tool_decision(row, message)


def mark_executed(approval_id: str, ok: bool = True, summary: str = "") -> bool:
    """Record that the allowed call ran (``ok``: it succeeded; ``summary``: what it did).

    ``True`` once; ``False`` when the call is unknown, not allowed, or was
    reported already: a call runs once.
    """
    return execution.record_execution(approval_id, ok, summary) == execution.EXECUTED


# -- async twins -----------------------------------------------------------


async def abegin_tool_decision(session_id: str, approval_id: str, **details: Any) -> Slot:
    """Async :func:`begin_tool_decision`."""
    return await limited_sync(begin_tool_decision, session_id, approval_id, **details)


async def await_tool_decision(
    slot: Slot,
    approval_id: str,
    cancel_event: Any = None,
    timeout: float | None = None,
) -> str:
    """Async :func:`wait_tool_decision`: a future, no thread; cancelling the task records
    ``cancelled`` and re-raises."""
    try:
        fut = slot.future()
        loop = asyncio.get_running_loop()
        remove_hook = on_set(cancel_event, lambda: loop.call_soon_threadsafe(slot.interrupt))
        # One future and one timer per waiter (``None``: timed out); wait_for and
        # shield would add two futures and their callbacks to each of 10,000 waiters.
        timer = loop.call_later(remaining(slot, timeout), settle, fut, None)
        try:
            outcome = await fut
        except asyncio.CancelledError:
            await _record_cancel_despite_cancellation(slot, approval_id)
            raise
        finally:
            timer.cancel()
            remove_hook()
        if outcome is not None and outcome != INTERRUPTED:
            return answer_for_status(outcome)  # decided: nothing left to record
        return answer_for_status(await limited_sync(finish, slot, approval_id, outcome))
    finally:
        get_listener().unregister(slot)


async def _record_cancel_despite_cancellation(slot: Slot, approval_id: str) -> None:
    if slot.status is not None:
        return
    # On a small pool of its own: it finishes even if this task is cancelled again
    # or the loop stops, and 10,000 cancellations queue rather than start threads.
    done = in_background(lambda: decide(approval_id, Status.CANCELLED, via=Via.CANCEL))
    try:
        await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(done)), 10)
    except (asyncio.CancelledError, TimeoutError):
        pass  # it goes on in the pool


async def arequest_tool_decision(
    session_id: str,
    approval_id: str,
    cancel_event: Any = None,
    timeout: float | None = None,
    **details: Any,
) -> str:
    """Async :func:`request_tool_decision`."""
    slot = await abegin_tool_decision(session_id, approval_id, timeout=timeout, **details)
    del details  # written to the row: nothing of the arguments is held while waiting
    return await await_tool_decision(slot, approval_id, cancel_event)


async def aabort_tool_decision(slot: Slot, approval_id: str) -> None:
    """Async :func:`abort_tool_decision`."""
    await sync_to_async(abort_tool_decision)(slot, approval_id)


async def aresolve_tool_decision(
    approval_id: str,
    decision: str,
    session_id: str | None = None,
    *,
    user: Any = None,
    via: str = "api",
    reason: str = "",
) -> bool:
    """Async :func:`resolve_tool_decision`."""
    status_for_answer(decision)
    return await sync_to_async(resolve_tool_decision)(
        approval_id, decision, session_id, user=user, via=via, reason=reason
    )


async def adenial_message(approval_id: str) -> str:
    """Async :func:`denial_message`."""
    return await sync_to_async(denial_message)(approval_id)


async def aget_decision(approval_id: str) -> ToolDecision:
    """Async :func:`get_decision`."""
    return await sync_to_async(get_decision)(approval_id)


async def amark_executed(approval_id: str, ok: bool = True, summary: str = "") -> bool:
    """Async :func:`mark_executed`."""
    return await sync_to_async(mark_executed)(approval_id, ok, summary)
