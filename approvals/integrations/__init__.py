"""Adapters that gate agent frameworks' tool calls through toolgate.

``approvals.integrations.pydantic_ai`` and ``approvals.integrations.openai_agents``
are the adapters; this package face re-exports the framework-neutral pieces
they share, from :mod:`approvals.deferred` (ids, gate-and-run, the deferred
flow) and :mod:`approvals.integrations.context` (whose run a call belongs to).
Nothing here imports a framework; each adapter module does.
"""

from ..deferred import (
    Target,
    ToolCall,
    Verdict,
    adefer_call,
    agate_call,
    aoutcomes,
    approval_id_for,
    call_approval_id,
    defer_call,
    outcomes,
    run_allowed,
)
from .context import GateContext, GateOptions, jsonable

__all__ = [
    "GateContext",
    "GateOptions",
    "Target",
    "ToolCall",
    "Verdict",
    "adefer_call",
    "agate_call",
    "aoutcomes",
    "approval_id_for",
    "call_approval_id",
    "defer_call",
    "jsonable",
    "outcomes",
    "run_allowed",
]
