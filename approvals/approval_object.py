"""The CONTRACT's approval object, for webhook bodies.

TODO(agent API): replace with the agent HTTP API's approval-object function
once it lands on main; this stand-in produces exactly the CONTRACT's fields so
the swap changes no body. Webhook code calls :func:`approval_object` only.
"""

from __future__ import annotations

from typing import Any

from . import gate
from .events import iso
from .models import Approval, Status, answer_for_status


def _message(approval: Approval) -> str | None:
    if approval.status in (Status.PENDING, Status.ALLOWED):
        return None
    simple = {
        Status.EXPIRED: gate.EXPIRED_MESSAGE,
        Status.CANCELLED: gate.CANCELLED_MESSAGE,
        Status.ABANDONED: gate.ABANDONED_MESSAGE,
    }
    if approval.status in simple:
        return simple[approval.status]
    if approval.reason:
        return f"{gate.TOOL_REJECTED_MESSAGE} Reason: {approval.reason}"
    return gate.TOOL_REJECTED_MESSAGE


def approval_object(approval: Approval) -> dict[str, Any]:
    """The approval object of the CONTRACT (agent HTTP API) for ``approval``."""
    pending = approval.status == Status.PENDING
    return {
        "approval_id": approval.approval_id,
        "session_id": approval.session_id,
        "tool_name": approval.tool_name,
        "tool_call_id": approval.tool_call_id,
        "arguments": approval.arguments,
        "edited_arguments": approval.edited_arguments,
        "description": approval.description,
        "editable": approval.editable,
        "status": approval.status,
        "decision": None if pending else str(answer_for_status(approval.status)),
        "decided_via": approval.decided_via,
        "reason": approval.reason,
        "message": _message(approval),
        "created_at": iso(approval.created_at),
        "expires_at": iso(approval.expires_at),
        "decided_at": iso(approval.decided_at),
        "executed_at": iso(approval.executed_at),
    }
