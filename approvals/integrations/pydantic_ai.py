"""Gate Pydantic AI tool calls through toolgate.

Wrap the tools that need a person's consent in :class:`GatedToolset` (or call
:func:`gated`) and give the agent that toolset::

    from approvals.integrations.pydantic_ai import gated

    agent = Agent(model, deps_type=Deps, toolsets=[gated([delete_file, send_mail])])
    agent.run_sync("tidy up", deps=Deps(session_id=chat.id, user=request.user))

Each call is written as a pending :class:`~approvals.models.Approval`, shown on
the approvals page, and waited for; on allow the tool runs, otherwise the model
gets :func:`~approvals.gate.denial_message` as the tool result and the run goes
on. Sync and async tools both work: the gate waits on the event loop without
blocking it, and Pydantic AI runs sync tools in a worker thread as usual.

With ``defer=True`` the run does not wait: it ends with Pydantic AI's
``DeferredToolRequests`` (add it to ``output_type``), the rows stay pending
with no process waiting, and :func:`deferred_results` later turns toolgate's
decisions into the ``DeferredToolResults`` for the resumed run. Tools marked
with Pydantic AI's own ``requires_approval=True`` map the same way through
:func:`defer_requests` and :func:`deferred_results`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import sync_to_async
from pydantic_ai import DeferredToolRequests, DeferredToolResults, ToolApproved, ToolDenied
from pydantic_ai.exceptions import ApprovalRequired
from pydantic_ai.tools import AgentDepsT, RunContext, ToolDefinition
from pydantic_ai.toolsets import AbstractToolset, FunctionToolset, ToolsetTool, WrapperToolset

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
    jsonable,
    outcomes,
    run_allowed,
)

__all__ = [
    "GatedToolset",
    "adefer_requests",
    "adeferred_results",
    "defer_requests",
    "deferred_results",
    "gated",
]

#: Key under which the approval id travels in ``DeferredToolRequests.metadata``.
METADATA_KEY = "approval_id"

ToolFilter = Callable[[RunContext[Any], ToolDefinition, dict[str, Any]], bool]


@dataclass
class GatedToolset(WrapperToolset[AgentDepsT]):
    """A toolset whose calls (all, or those ``only`` selects) wait for a person's answer.

    The session and user of each call come from ``context(ctx)`` when given,
    else the fixed ``session_id``/``user``, else the run's deps (any object or
    mapping with ``session_id`` and ``user``, see
    :class:`~approvals.integrations.GateContext`). ``only`` is a collection of
    tool names or a ``(ctx, tool_def, args) -> bool`` predicate; ``None`` gates
    every tool. ``timeout`` is how long a call may wait (default
    ``APPROVALS["DECISION_TIMEOUT"]``). ``defer=True`` ends the run with
    ``DeferredToolRequests`` instead of waiting.
    """

    session_id: str | None = field(default=None, kw_only=True)
    user: Any = field(default=None, kw_only=True)
    context: Callable[[RunContext[AgentDepsT]], Any] | None = field(default=None, kw_only=True)
    only: Collection[str] | ToolFilter | None = field(default=None, kw_only=True)
    #: The former name of ``only``; still read, with a DeprecationWarning.
    tools: Collection[str] | ToolFilter | None = field(default=None, kw_only=True)
    timeout: float | None = field(default=None, kw_only=True)
    defer: bool = field(default=False, kw_only=True)

    async def call_tool(
        self,
        name: str,
        tool_args: dict[str, Any],
        ctx: RunContext[AgentDepsT],
        tool: ToolsetTool[AgentDepsT],
    ) -> Any:
        """Run the call if a person (or a rule) allows it; else return the denial text."""
        if not self._gates(name, tool_args, ctx, tool):
            return await self.wrapped.call_tool(name, tool_args, ctx, tool)
        options = GateOptions(self.session_id, self.user, self.context, self.timeout)
        target = options.target(ctx, ctx.deps)
        tool_def = tool.tool_def
        call = ToolCall(
            name,
            jsonable(tool_args),
            ctx.tool_call_id or "",
            tool_def.description or "",
            True,  # the tool runs with the arguments the person approved
            tool_def.parameters_json_schema or None,
        )

        async def run(approved: dict) -> Any:
            args = tool_args if approved == call.arguments else approved
            return await self.wrapped.call_tool(name, args, ctx, tool)

        if self.defer:
            return await self._deferred(target, call, ctx, run)
        # The run id keeps a provider's reused call ids from meeting an older run's row;
        # a durable engine replaying this run keeps its run id and so finds its row.
        scope = getattr(ctx, "run_id", None) or ""
        approval_id = await sync_to_async(call_approval_id)(target, call, None, scope)
        return await agate_call(target, call, run, approval_id=approval_id, timeout=self.timeout)

    async def _deferred(self, target: Target, call: ToolCall, ctx: RunContext, run) -> Any:
        hint = _hint(getattr(ctx, "tool_call_metadata", None))
        approval_id = await sync_to_async(call_approval_id)(target, call, hint)
        verdict = await adefer_call(target, call, approval_id=approval_id, timeout=self.timeout)
        if verdict.pending:
            raise ApprovalRequired(metadata={METADATA_KEY: approval_id})
        if verdict.allowed:
            return await run_allowed(approval_id, run)
        return verdict.message

    def __post_init__(self) -> None:
        if self.tools is not None:
            warnings.warn(
                "GatedToolset(tools=...) is now only=..., as in gated()",
                DeprecationWarning,
                stacklevel=3,
            )
            if self.only is None:
                self.only = self.tools

    def _gates(self, name: str, args: dict, ctx: RunContext, tool: ToolsetTool) -> bool:
        if self.only is None:
            return True
        if callable(self.only):
            return bool(self.only(ctx, tool.tool_def, args))
        return name in self.only


def gated(
    tools: AbstractToolset[AgentDepsT] | Sequence[Any],
    *,
    session_id: str | None = None,
    user: Any = None,
    context: Callable[[RunContext[AgentDepsT]], Any] | None = None,
    only: Collection[str] | ToolFilter | None = None,
    timeout: float | None = None,
    defer: bool = False,
) -> GatedToolset[AgentDepsT]:
    """Gate a toolset, or a list of tool functions / ``Tool`` objects, through toolgate.

    A list is turned into a ``FunctionToolset`` first. ``only`` narrows the
    gate to some tools (names or a predicate); the other options are those of
    :class:`GatedToolset`.
    """
    toolset = tools if isinstance(tools, AbstractToolset) else FunctionToolset(list(tools))
    return GatedToolset(
        toolset,
        session_id=session_id,
        user=user,
        context=context,
        only=only,
        timeout=timeout,
        defer=defer,
    )


def defer_requests(
    requests: DeferredToolRequests,
    *,
    session_id: str,
    user: Any = None,
    timeout: float | None = None,
) -> dict[str, Verdict]:
    """Record each call in ``requests.approvals`` as a pending toolgate approval.

    For tools that use Pydantic AI's own ``requires_approval``: the calls show on
    the approvals page with no process waiting. Returns ``{tool_call_id:
    Verdict}`` (a rule may already have answered) and stores each approval id in
    ``requests.metadata[tool_call_id]["approval_id"]``. Safe to call again.
    ``timeout`` is how long a person has to answer.
    """
    target = Target(session_id, user)
    result = {}
    for part in requests.approvals:
        call = _call(part)
        meta = requests.metadata.setdefault(part.tool_call_id, {})
        approval_id = call_approval_id(target, call, meta.get(METADATA_KEY))
        meta[METADATA_KEY] = approval_id
        result[part.tool_call_id] = defer_call(
            target, call, approval_id=approval_id, timeout=timeout
        )
    return result


async def adefer_requests(
    requests: DeferredToolRequests,
    *,
    session_id: str,
    user: Any = None,
    timeout: float | None = None,
) -> dict[str, Verdict]:
    """Async :func:`defer_requests`."""
    return await sync_to_async(defer_requests)(
        requests, session_id=session_id, user=user, timeout=timeout
    )


def deferred_results(
    requests: DeferredToolRequests, *, session_id: str, wait: bool = False
) -> DeferredToolResults:
    """Build the ``DeferredToolResults`` for resuming a run from toolgate's decisions.

    Allowed calls become ``ToolApproved()``; denied, expired, cancelled or
    abandoned ones ``ToolDenied(denial_message)``. Decisions made while no
    process waited count. Calls still pending are left out unless ``wait=True``
    (then this blocks until each is decided or expires): resume once every
    call in ``requests.approvals`` has its entry in ``results.approvals``.
    """
    target = Target(session_id)
    ids = {
        part.tool_call_id: call_approval_id(
            target, _call(part), _hint(requests.metadata.get(part.tool_call_id))
        )
        for part in requests.approvals
    }
    verdicts = outcomes(session_id, ids.values(), wait=wait)
    return _results(ids, verdicts)


async def adeferred_results(
    requests: DeferredToolRequests, *, session_id: str, wait: bool = False
) -> DeferredToolResults:
    """Async :func:`deferred_results`; with ``wait=True`` it awaits without holding a thread."""
    target = Target(session_id)
    ids = {}
    for part in requests.approvals:
        hint = _hint(requests.metadata.get(part.tool_call_id))
        ids[part.tool_call_id] = await sync_to_async(call_approval_id)(target, _call(part), hint)
    verdicts = await aoutcomes(session_id, ids.values(), wait=wait)
    return _results(ids, verdicts)


def _results(ids: dict[str, str], verdicts: dict[str, Verdict]) -> DeferredToolResults:
    approvals: dict[str, Any] = {}
    metadata: dict[str, dict[str, Any]] = {}
    for tool_call_id, approval_id in ids.items():
        verdict = verdicts.get(approval_id)
        if verdict is None or verdict.pending:
            continue
        if verdict.allowed:
            # A person's edit travels as Pydantic AI's own override of the call's arguments.
            edit = verdict.edited_arguments
            approvals[tool_call_id] = ToolApproved(override_args=edit) if edit else ToolApproved()
        else:
            approvals[tool_call_id] = ToolDenied(verdict.message)
        metadata[tool_call_id] = {METADATA_KEY: approval_id}
    return DeferredToolResults(approvals=approvals, metadata=metadata)


def _call(part: Any) -> ToolCall:
    return ToolCall(part.tool_name, jsonable(part.args_as_dict()), part.tool_call_id or "")


def _hint(metadata: Any) -> str | None:
    if isinstance(metadata, dict):
        value = metadata.get(METADATA_KEY)
        return value if isinstance(value, str) else None
    return None
