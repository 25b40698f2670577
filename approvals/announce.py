"""Telling the world after a change commits: sockets, other processes, signal receivers.

Called from :mod:`approvals.gate` and :mod:`approvals.decisions` once their
transaction has committed. Events go to this process's listener when one runs
(it hands them to local waiters and sockets and to the other processes);
without one, other processes learn from the database, which is the truth.
"""

from __future__ import annotations

from typing import Any

from . import events, listener, signals
from .models import Approval, Status


def call_gated(approval: Approval) -> None:
    """A newly gated call's row has committed (decided already when a rule answered)."""
    listener.dispatch(events.tool_start(approval))
    signals.approval_requested.send(sender=Approval, approval=approval)
    if approval.status != Status.PENDING:
        row = {
            "approval_id": approval.approval_id,
            "session_id": approval.session_id,
            "user_id": approval.user_id,
        }
        listener.dispatch(
            events.tool_decision(row, approval.status, approval.decided_via, None, approval.reason)
        )
        _send_decided(approval, None)


def call_decided(pk: Any, event: dict) -> None:
    """A decision has committed: ``event`` is its ``tool_decision``."""
    listener.dispatch(event)
    if signals.approval_decided.has_listeners(Approval):
        approval = Approval.objects.select_related("decided_by").get(pk=pk)
        _send_decided(approval, approval.decided_by)


def _send_decided(approval: Approval, decided_by: Any) -> None:
    signals.approval_decided.send(
        sender=Approval,
        approval=approval,
        status=approval.status,
        decided_via=approval.decided_via,
        decided_by=decided_by,
    )
