"""Gate OpenAI Agents SDK tool calls through toolgate.

Mark a tool as gated with :func:`gated_function_tool` (in place of
``@function_tool``) or wrap an existing ``FunctionTool`` with :func:`gate_tool`::

    from approvals.integrations.openai_agents import gated_function_tool

    @gated_function_tool
    def delete_file(path: str) -> str: ...

    agent = Agent(name="ops", tools=[delete_file])
    await Runner.run(agent, "tidy up", context={"session_id": chat.id, "user": request.user})

Each call is written as a pending :class:`~approvals.models.Approval`, shown on
the approvals page and waited for without blocking the event loop; on allow the
tool runs, otherwise the model gets :func:`~approvals.gate.denial_message` as
the tool output and the run goes on. Sync tools keep running in the SDK's
worker thread.

With ``defer=True`` the tool uses the SDK's own ``needs_approval``: the run
stops with ``result.interruptions``. :func:`defer_interruptions` records them
as pending rows with no process waiting; later :func:`apply_decisions`
approves or rejects them in the ``RunState`` from toolgate's decisions, and
``Runner.run(agent, state)`` resumes. Tools with a plain
``needs_approval=True`` map the same way.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

from agents import FunctionTool, RunContextWrapper, function_tool
from agents.tool_context import ToolContext
from asgiref.sync import sync_to_async

from . import (
    GateOptions,
    Target,
    ToolCall,
    Verdict,
    adefer_call,
    agate_call,
    aoutcomes,
    call_approval_id,
    defer_call,
    outcomes,
)

__all__ = [
    "aapply_decisions",
    "adefer_interruptions",
    "apply_decisions",
    "defer_interruptions",
    "gate_tool",
    "gated_function_tool",
]


def gate_tool(
    tool: FunctionTool,
    *,
    session_id: str | None = None,
    user: Any = None,
    context: Callable[[RunContextWrapper[Any]], Any] | None = None,
    timeout: float | None = None,
    defer: bool = False,
) -> FunctionTool:
    """A copy of ``tool`` whose calls wait for a person's answer (or a rule's).

    The session and user of each call come from ``context(run_context)`` when
    given, else the fixed ``session_id``/``user``, else the run's context (any
    object or mapping with ``session_id`` and ``user``, see
    :class:`~approvals.integrations.GateContext`). ``timeout`` is how long a
    call may wait. ``defer=True`` interrupts the run instead of waiting (the
    SDK's ``needs_approval``), unless a rule or an earlier answer already decided.
    """
    options = GateOptions(session_id, user, context, timeout)
    original = tool.on_invoke_tool
    name = tool.name

    def gated_call(params: dict, call_id: str) -> ToolCall:
        # Editable: the tool then runs with the arguments the person approved,
        # which must fit the tool's own JSON Schema.
        schema = tool.params_json_schema or None
        return ToolCall(name, params, call_id, tool.description or "", True, schema)

    async def invoke(ctx: ToolContext[Any], arguments: str) -> Any:
        target = options.target(ctx, ctx.context)
        call = gated_call(_parse(arguments), ctx.tool_call_id or "")
        approval_id = await sync_to_async(call_approval_id)(target, call)

        async def run(approved: dict) -> Any:
            same = approved == call.arguments
            return await original(ctx, arguments if same else json.dumps(approved))

        # A deferred call was decided before the run resumed: this returns at once.
        return await agate_call(target, call, run, approval_id=approval_id, timeout=timeout)

    async def needs_approval(ctx: RunContextWrapper[Any], params: dict, call_id: str) -> bool:
        target = options.target(ctx, ctx.context)
        _store_user_key(ctx.context)
        call = gated_call(dict(params), call_id or "")
        approval_id = await sync_to_async(call_approval_id)(target, call)
        verdict = await adefer_call(target, call, approval_id=approval_id, timeout=timeout)
        return verdict.pending

    changes: dict[str, Any] = {"on_invoke_tool": invoke}
    if defer:
        changes["needs_approval"] = needs_approval
    return dataclasses.replace(tool, **changes)


def gated_function_tool(
    func: Callable[..., Any] | None = None,
    *,
    session_id: str | None = None,
    user: Any = None,
    context: Callable[[RunContextWrapper[Any]], Any] | None = None,
    timeout: float | None = None,
    defer: bool = False,
    **function_tool_options: Any,
) -> Any:
    """``@function_tool``, gated: use bare or with options, like ``function_tool`` itself.

    Gate options are those of :func:`gate_tool`; everything else
    (``name_override``, ``description_override``, ...) goes to ``function_tool``.
    """

    def decorate(f: Callable[..., Any]) -> FunctionTool:
        tool = function_tool(f, **function_tool_options)
        return gate_tool(
            tool, session_id=session_id, user=user, context=context, timeout=timeout, defer=defer
        )

    return decorate if func is None else decorate(func)


def defer_interruptions(
    interruptions: Any,
    *,
    session_id: str,
    user: Any = None,
    timeout: float | None = None,
) -> dict[str, Verdict]:
    """Record a stopped run's tool approvals as pending toolgate approvals.

    ``interruptions`` is a run result (its ``.interruptions``), a ``RunState``
    (its ``get_interruptions()``) or a list of ``ToolApprovalItem``. The calls
    show on the approvals page with no process waiting. Returns ``{call_id:
    Verdict}`` (a rule may already have answered). Safe to call again.
    """
    target = Target(session_id, user)
    result = {}
    for item in _items(interruptions):
        call = _call(item)
        if call is None:
            continue
        approval_id = call_approval_id(target, call)
        result[call.tool_call_id] = defer_call(
            target, call, approval_id=approval_id, timeout=timeout
        )
    return result


async def adefer_interruptions(
    interruptions: Any,
    *,
    session_id: str,
    user: Any = None,
    timeout: float | None = None,
) -> dict[str, Verdict]:
    """Async :func:`defer_interruptions`."""
    return await sync_to_async(defer_interruptions)(
        interruptions, session_id=session_id, user=user, timeout=timeout
    )


def apply_decisions(state: Any, *, session_id: str, wait: bool = False) -> list:
    """Approve or reject a ``RunState``'s interruptions from toolgate's decisions.

    Allowed calls are ``state.approve``-d; denied, expired, cancelled or
    abandoned ones ``state.reject``-ed with :func:`~approvals.gate.denial_message`
    as the text the model gets. Decisions made while no process waited count.
    Returns the interruptions still pending (none with ``wait=True``, which
    blocks until each is decided or expires); resume with ``Runner.run(agent, state)``.
    """
    items, ids = _ids(state, session_id)
    return _apply(state, items, ids, outcomes(session_id, ids.values(), wait=wait))


async def aapply_decisions(state: Any, *, session_id: str, wait: bool = False) -> list:
    """Async :func:`apply_decisions`; with ``wait=True`` it awaits without holding a thread."""
    items, ids = await sync_to_async(_ids)(state, session_id)
    return _apply(state, items, ids, await aoutcomes(session_id, ids.values(), wait=wait))


def _ids(state: Any, session_id: str) -> tuple[list, dict[str, str]]:
    items, ids = [], {}
    for item in _items(state):
        call = _call(item)
        if call is not None:
            items.append((item, call))
            ids[call.tool_call_id] = call_approval_id(Target(session_id), call)
    return items, ids


def _apply(state: Any, items: list, ids: dict[str, str], verdicts: dict[str, Verdict]) -> list:
    still_pending = []
    for item, call in items:
        verdict = verdicts.get(ids[call.tool_call_id])
        if verdict is None or verdict.pending:
            still_pending.append(item)
        elif verdict.allowed:
            state.approve(item)
        else:
            state.reject(item, rejection_message=verdict.message)
    return still_pending


def _store_user_key(context: Any) -> None:
    """A deferred run is saved with ``RunState.to_string()``, which writes a dict context as
    JSON: a user instance in it becomes its primary key, which resolves to the same user."""
    if isinstance(context, dict) and hasattr(context.get("user"), "pk"):
        context["user"] = context["user"].pk


def _items(source: Any) -> list:
    if hasattr(source, "get_interruptions"):
        return list(source.get_interruptions())
    if hasattr(source, "interruptions"):
        return list(source.interruptions)
    return list(source)


def _call(item: Any) -> ToolCall | None:
    raw = getattr(item, "raw_item", item)
    get = raw.get if isinstance(raw, dict) else lambda key: getattr(raw, key, None)
    call_id, name = get("call_id"), getattr(item, "tool_name", None) or get("name")
    if not call_id or not name:
        return None
    return ToolCall(name, _parse(get("arguments")), call_id)


def _parse(arguments: Any) -> dict:
    if isinstance(arguments, dict):
        return arguments
    if not arguments:
        return {}
    try:
        value = json.loads(arguments)
    except (TypeError, ValueError):
        return {"input": str(arguments)}
    return value if isinstance(value, dict) else {"input": value}
