"""Adapters that gate agent frameworks' tool calls through toolgate.

``approvals.integrations.pydantic_ai`` and ``approvals.integrations.openai_agents``
build on the framework-neutral pieces here:

* :class:`GateContext` - what an adapter must learn about a run: its session
  and its user. Put ``session_id`` (and ``user``) on your run's deps/context,
  pass them to the wrapper, or give the wrapper a ``context`` callable.
* :func:`approval_id_for` - a stable, unguessable approval id derived from the
  session and the framework's tool call id, so a run that stops and resumes
  finds the same :class:`~approvals.models.Approval` row.
* :func:`agate_call` - gate one call and run it on allow (waits for a person).
* :func:`defer_call` / :func:`outcomes` - the deferred flow: write the pending
  row with no process waiting, and later read what was decided.

Nothing here imports a framework; each adapter module does.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

from asgiref.sync import sync_to_async
from django.utils import timezone
from django.utils.crypto import salted_hmac

from .. import decisions, gate
from ..listener import get_listener
from ..models import Approval, Status, Via
from ..slots import Slot

__all__ = [
    "GateContext",
    "GateOptions",
    "Target",
    "ToolCall",
    "Verdict",
    "agate_call",
    "approval_id_for",
    "choose_approval_id",
    "jsonable",
    "pick_approval_id",
    "recorded_approval_id",
    "adefer_call",
    "aoutcomes",
    "defer_call",
    "outcomes",
    "release_slot",
]

T = TypeVar("T")


@runtime_checkable
class GateContext(Protocol):
    """Whose run this is: what an adapter reads from the framework's deps/context.

    Any object with these two attributes works (a dataclass, your deps class,
    a Django model); a mapping with ``"session_id"`` and ``"user"`` keys works
    too. ``user`` may be a user instance, a primary key, or ``None``.
    """

    session_id: str
    user: Any


@dataclass(frozen=True)
class Target:
    """The session and user one gated call belongs to."""

    session_id: str
    user: Any = None


@dataclass(frozen=True)
class ToolCall:
    """One call as the framework made it: name, JSON arguments, the framework's call id."""

    tool_name: str
    arguments: dict
    tool_call_id: str = ""


@dataclass(frozen=True)
class Verdict:
    """What became of one call: its status and, unless allowed, the text for the model."""

    approval_id: str
    status: str
    message: str = ""

    @property
    def allowed(self) -> bool:
        return self.status == Status.ALLOWED

    @property
    def pending(self) -> bool:
        return self.status == Status.PENDING


@dataclass(frozen=True)
class GateOptions:
    """How an adapter finds the :class:`Target` of a call, and how long a call may wait.

    ``context(framework_ctx)`` wins when given; else a fixed ``session_id`` (with
    ``user``); else the run's deps/context object must look like :class:`GateContext`.
    """

    session_id: str | None = None
    user: Any = None
    context: Callable[[Any], Any] | None = None
    timeout: float | None = None

    def target(self, framework_ctx: Any, deps: Any) -> Target:
        """The session and user for a call made with ``framework_ctx`` and ``deps``."""
        if self.context is not None:
            return _as_target(self.context(framework_ctx), "the context callable's result")
        if self.session_id is not None:
            return Target(str(self.session_id), self.user)
        return _as_target(deps, "the run's deps/context")


def _as_target(source: Any, what: str) -> Target:
    if isinstance(source, Target):
        return source
    if isinstance(source, Mapping):
        session_id, user = source.get("session_id"), source.get("user")
    else:
        session_id = getattr(source, "session_id", None)
        user = getattr(source, "user", None)
    if session_id is None:
        raise TypeError(
            f"toolgate needs a session for this tool call, but {what} ({type(source).__name__}) "
            "has no session_id: give it session_id/user attributes (see GateContext), or pass "
            "session_id= or context= to the gated wrapper."
        )
    return Target(str(session_id), user)


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


def jsonable(arguments: Any) -> dict:
    """The call's arguments as a JSON-serialisable dict (validated models become plain data)."""
    try:
        json.dumps(arguments)
        data = arguments
    except (TypeError, ValueError):
        try:
            from pydantic_core import to_jsonable_python

            data = to_jsonable_python(arguments, fallback=str)
        except ImportError:  # pragma: no cover - both frameworks ship pydantic
            data = json.loads(json.dumps(arguments, default=str))
    return data if isinstance(data, dict) else {"input": data}


def choose_approval_id(target: Target, call: ToolCall, scope: str = "") -> str:
    """The derived id for ``call``, unless its row records a different call.

    Some models reuse call ids (``call_0`` on every turn). A row under the derived
    id whose tool or arguments differ is another call, so this one gets a fresh
    random id and is asked about on its own.
    """
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


def pick_approval_id(target: Target, call: ToolCall, hint: Any = None, scope: str = "") -> str:
    """The id to gate ``call`` under: ``hint`` (an id the framework carried through a
    pause) when its row is this call, else :func:`choose_approval_id`."""
    if _hint_matches(target, call, hint):
        return hint
    return choose_approval_id(target, call, scope)


def recorded_approval_id(target: Target, call: ToolCall, hint: Any = None, scope: str = "") -> str:
    """The id ``call`` was recorded under: a valid ``hint``, else the derived id.

    A hint is trusted only when its row has this session, tool name and call id,
    so a forged id cannot borrow another call's answer.
    """
    if _hint_matches(target, call, hint):
        return hint
    return approval_id_for(target.session_id, call.tool_call_id, call.tool_name, scope)


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
    )


async def agate_call(
    target: Target,
    call: ToolCall,
    run: Callable[[], Awaitable[T]],
    *,
    approval_id: str,
    timeout: float | None = None,
) -> T | str:
    """Gate ``call``, wait for the answer without blocking the loop, then run it or refuse.

    On allow, returns what ``run()`` returns. On deny, expiry or cancel, returns
    :func:`~approvals.gate.denial_message` for the model, and ``run`` is never
    called. Cancelling the awaiting task records ``cancelled``.
    """
    slot = await sync_to_async(_begin)(target, call, approval_id, timeout)
    answer = await gate.await_tool_decision(slot, approval_id)
    if answer == "allow":
        return await run()
    return await gate.adenial_message(approval_id)


def release_slot(slot: Slot, approval_id: str) -> None:
    """Leave a pending call for later: drop this process's waiter but keep the row pending.

    The row's ``waiter`` is cleared, so the sweep does not mark the call
    ``abandoned`` when this process goes away; it still expires at ``expires_at``.
    """
    get_listener().unregister(slot)
    Approval.objects.filter(approval_id=approval_id, status=Status.PENDING).update(waiter="")


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
    release_slot(slot, approval_id)
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
            outcome = decisions.decide(row["approval_id"], Status.EXPIRED, via=Via.TIMEOUT)
            status = outcome.status or Status.EXPIRED
        found[row["approval_id"]] = status
    return found


def _current_status(approval_id: str) -> str:
    status = (
        Approval.objects.filter(approval_id=approval_id).values_list("status", flat=True).first()
    )
    return status or Status.PENDING


def _verdict(approval_id: str, status: str) -> Verdict:
    if status in (Status.ALLOWED, Status.PENDING):
        return Verdict(approval_id, status)
    return Verdict(approval_id, status, gate.denial_message(approval_id))
