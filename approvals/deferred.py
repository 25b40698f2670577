"""Gating a framework's tool call: derived ids, gate-and-run, and the deferred flow.

The framework adapters in :mod:`approvals.integrations` build on these, and on
nothing else of the app but :mod:`approvals.gate`:

* :func:`approval_id_for` / :func:`call_approval_id` - the one way a call's
  approval id is chosen: stable for a framework call id (so a run that stops
  and resumes finds its row), fresh when a model reuses a call id for another
  call, or the id the framework carried through a pause;
* :func:`agate_call` - gate one call and run it on allow (waits for a person);
* :func:`defer_call` / :func:`outcomes` - the deferred flow: write the pending
  row with no process waiting, and later read what was decided.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.utils import timezone
from django.utils.crypto import salted_hmac

from . import gate
from .decisions import decide
from .models import Approval, Status, Via
from .waiting import Slot

__all__ = [
    "Target",
    "ToolCall",
    "Verdict",
    "adefer_call",
    "agate_call",
    "aoutcomes",
    "approval_id_for",
    "call_approval_id",
    "defer_call",
    "outcomes",
    "run_allowed",
]

T = TypeVar("T")


@dataclass(frozen=True)
class Target:
    """The session and user one gated call belongs to."""

    session_id: str
    user: Any = None


@dataclass(frozen=True)
class ToolCall:
    """One call as the framework made it: name, JSON arguments, the framework's call id.

    ``description`` is shown on the card; ``editable`` lets a person change the
    arguments before allowing (the adapter then runs what was approved), checked
    against ``arguments_schema`` (the tool's JSON Schema) when given.
    """

    tool_name: str
    arguments: dict
    tool_call_id: str = ""
    description: str = ""
    editable: bool = False
    arguments_schema: dict | None = None


@dataclass(frozen=True)
class Verdict:
    """What became of one call: its status and, unless allowed, the text for the model."""

    approval_id: str
    status: str
    message: str = ""
    #: A person's edit of an allowed call's arguments; ``None`` when run as proposed.
    edited_arguments: dict | None = None

    @property
    def allowed(self) -> bool:
        return self.status == Status.ALLOWED

    @property
    def pending(self) -> bool:
        return self.status == Status.PENDING


def approval_id_for(
    session_id: str, tool_call_id: str, tool_name: str = "", scope: str = ""
) -> str:
    """A stable approval id for one framework tool call, or a random one without a call id.

    The same session, tool name, call id (and optional ``scope``, e.g. a run id)
    always give the same id, so a resumed run finds its row; an HMAC keyed with
    ``SECRET_KEY`` keeps it unguessable (192 bits, URL-safe base64). Rotating
    ``SECRET_KEY`` changes the ids: calls deferred before then are asked again.
    """
    if not tool_call_id:
        return gate.new_approval_id()
    message = "\x1f".join((session_id, tool_name, tool_call_id, scope))
    digest = salted_hmac("approvals.integrations.approval_id", message, algorithm="sha256").digest()
    return base64.urlsafe_b64encode(digest[:24]).decode("ascii")


def call_approval_id(target: Target, call: ToolCall, hint: Any = None, scope: str = "") -> str:
    """The approval id of ``call``: the one function both adapters use, gating or reading.

    ``hint`` (an id the framework carried through a pause) wins when its row is
    this call: same session, tool name and call id, so a forged id cannot
    borrow another call's answer. Otherwise the id derived by
    :func:`approval_id_for`, unless its row records a different call (some
    models reuse call ids, ``call_0`` on every turn): then a fresh random id,
    so the call is asked about on its own and never inherits another's answer.
    """
    if _hint_matches(target, call, hint):
        return hint
    # The arguments are part of the id: a model that reuses a call id (``call_0`` on
    # every turn) for another call gets another id, the same one wherever the call
    # is seen again (gating, deferring, applying decisions), with nothing to carry.
    scope = f"{scope}\x1e{_canonical(call.arguments)}"
    approval_id = approval_id_for(target.session_id, call.tool_call_id, call.tool_name, scope)
    if not call.tool_call_id:
        return approval_id
    row = (
        Approval.objects.filter(approval_id=approval_id)
        .values("session_id", "tool_name", "arguments")
        .first()
    )
    if row is None or _same_call(row, target, call):
        return approval_id
    return gate.new_approval_id()


def _hint_matches(target: Target, call: ToolCall, hint: Any) -> bool:
    if not (isinstance(hint, str) and hint and call.tool_call_id):
        return False
    return Approval.objects.filter(
        approval_id=hint,
        session_id=target.session_id,
        tool_name=call.tool_name,
        tool_call_id=call.tool_call_id,
    ).exists()


def _same_call(row: Mapping, target: Target, call: ToolCall) -> bool:
    return (
        row["session_id"] == target.session_id
        and row["tool_name"] == call.tool_name
        and _canonical(row["arguments"]) == _canonical(call.arguments)
    )


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def _begin(target: Target, call: ToolCall, approval_id: str, timeout: float | None) -> Slot:
    return gate.begin_tool_decision(
        target.session_id,
        approval_id,
        tool_name=call.tool_name,
        arguments=call.arguments,
        user=target.user,
        tool_call_id=call.tool_call_id,
        timeout=timeout,
        description=call.description[:2000],
        editable=call.editable,
        arguments_schema=call.arguments_schema,
    )


async def agate_call(
    target: Target,
    call: ToolCall,
    run: Callable[[dict], Awaitable[T]],
    *,
    approval_id: str,
    timeout: float | None = None,
) -> T | str:
    """Gate ``call``, wait for the answer without blocking the loop, then run it or refuse.

    On allow, returns what ``run(arguments)`` returns, called with the approved
    arguments (a person's edit, else the proposal), and records
    ``mark_executed``. On deny, expiry or cancel, returns
    :func:`~approvals.gate.denial_message` for the model, and ``run`` is never
    called. Cancelling the awaiting task records ``cancelled``.
    """
    slot = await sync_to_async(_begin)(target, call, approval_id, timeout)
    answer = await gate.await_tool_decision(slot, approval_id)
    if answer == "allow":
        return await run_allowed(approval_id, run)
    return await gate.adenial_message(approval_id)


async def run_allowed(approval_id: str, run: Callable[[dict], Awaitable[T]]) -> T:
    """Run an allowed call with its approved arguments, then report that it ran
    (``mark_executed``: ok, or not ok with the exception, which is re-raised)."""
    decision = await gate.aget_decision(approval_id)
    try:
        result = await run(decision.arguments)
    except BaseException as exc:
        await gate.amark_executed(approval_id, ok=False, summary=f"{type(exc).__name__}: {exc}")
        raise
    await gate.amark_executed(approval_id, ok=True, summary=_summary(result))
    return result


def _summary(result: Any) -> str:
    text = result if isinstance(result, str) else repr(result)
    return text[:500]


def defer_call(
    target: Target, call: ToolCall, *, approval_id: str, timeout: float | None = None
) -> Verdict:
    """Record ``call`` as pending with no process waiting; report what is known already.

    Returns a pending :class:`Verdict` when a person must still answer. A rule
    that matches, or an earlier answer for the same ``approval_id`` (a resume),
    gives the final verdict at once. Calling it again for the same id is safe.
    """
    slot = _begin(target, call, approval_id, timeout)
    status = slot.status
    gate.release_tool_decision(slot, approval_id)
    if status is None:
        return _verdict(approval_id, _current_status(approval_id))
    return _verdict(approval_id, status)


async def adefer_call(
    target: Target, call: ToolCall, *, approval_id: str, timeout: float | None = None
) -> Verdict:
    """Async :func:`defer_call`."""
    return await sync_to_async(defer_call)(target, call, approval_id=approval_id, timeout=timeout)


def outcomes(session_id: str, approval_ids: Iterable[str], *, wait: bool = False) -> dict:
    """What was decided for each approval id of ``session_id``: ``{approval_id: Verdict}``.

    Decisions made while no process waited count. A pending call past its
    deadline is recorded ``expired`` now. With ``wait=True`` the calls still
    pending are waited for (each until it is decided or expires); otherwise they
    are reported pending. Ids unknown or of another session are left out.
    """
    rows = _rows(session_id, approval_ids)
    result = {aid: _verdict(aid, status) for aid, status in rows.items()}
    for aid, verdict in result.items():
        if verdict.pending and wait:
            slot = gate.begin_tool_decision(session_id, aid)
            gate.wait_tool_decision(slot, aid)
            result[aid] = _verdict(aid, _current_status(aid))
    return result


async def aoutcomes(session_id: str, approval_ids: Iterable[str], *, wait: bool = False) -> dict:
    """Async :func:`outcomes`; with ``wait=True`` all pending calls are awaited together."""
    result = await sync_to_async(outcomes)(session_id, list(approval_ids))
    pending = [aid for aid, verdict in result.items() if verdict.pending]
    if wait and pending:
        await asyncio.gather(*(_await_one(session_id, aid) for aid in pending))
        result.update(await sync_to_async(outcomes)(session_id, pending))
    return result


async def _await_one(session_id: str, approval_id: str) -> None:
    slot = await gate.abegin_tool_decision(session_id, approval_id)
    await gate.await_tool_decision(slot, approval_id)


def _rows(session_id: str, approval_ids: Iterable[str]) -> dict[str, str]:
    ids = list(dict.fromkeys(approval_ids))
    now = timezone.now()
    found = {}
    rows = Approval.objects.filter(approval_id__in=ids, session_id=session_id).values(
        "approval_id", "status", "expires_at"
    )
    for row in rows:
        status = row["status"]
        if status == Status.PENDING and row["expires_at"] <= now:
            outcome = decide(row["approval_id"], Status.EXPIRED, via=Via.TIMEOUT)
            status = outcome.status or Status.EXPIRED
        found[row["approval_id"]] = status
    return found


def _current_status(approval_id: str) -> str:
    status = (
        Approval.objects.filter(approval_id=approval_id).values_list("status", flat=True).first()
    )
    return status or Status.PENDING


def _verdict(approval_id: str, status: str) -> Verdict:
    if status == Status.ALLOWED:
        edit = (
            Approval.objects.filter(approval_id=approval_id)
            .values_list("edited_arguments", flat=True)
            .first()
        )
        return Verdict(approval_id, status, "", edit)
    if status == Status.PENDING:
        return Verdict(approval_id, status)
    return Verdict(approval_id, status, gate.denial_message(approval_id))
