"""What an allowed call runs, and the record that it ran: once.

:func:`record_execution` is the one conditional update behind
``gate.mark_executed`` and the agent API's ``executed`` endpoint: it changes a
row only while the call is allowed and not yet reported, so a call is reported
run once, from any process. :class:`ToolDecision` is the outcome as an agent
needs it (what to run, or what to tell the model).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.utils import timezone

from .models import Approval, Status

EXECUTED = "executed"
NOT_FOUND = "not_found"
NOT_ALLOWED = "not_allowed"
ALREADY_EXECUTED = "already_executed"
#: The longest execution summary kept; a longer one is cut.
MAX_SUMMARY_LENGTH = 10_000


@dataclass(frozen=True)
class ToolDecision:
    """A call's outcome as its agent needs it.

    ``arguments`` is what to run: the person's edit if any, else the proposal.
    ``message`` is what to feed the model when the call is not allowed
    (``gate.denial_message``), else ``None``.
    """

    approval_id: str
    status: str
    allowed: bool
    arguments: dict
    reason: str
    message: str | None
    decided_via: str
    decided_by_id: Any


DECISION_FIELDS = (
    "approval_id",
    "status",
    "arguments",
    "edited_arguments",
    "reason",
    "decided_via",
    "decided_by_id",
)


def decision_row(approval_id: str) -> dict | None:
    """The fields :class:`ToolDecision` is made of, or ``None`` for an unknown id."""
    return Approval.objects.filter(approval_id=approval_id).values(*DECISION_FIELDS).first()


def tool_decision(row: dict, message: str | None) -> ToolDecision:
    """A :class:`ToolDecision` from :func:`decision_row`'s row."""
    edited = row["edited_arguments"]
    return ToolDecision(
        approval_id=row["approval_id"],
        status=row["status"],
        allowed=row["status"] == Status.ALLOWED,
        arguments=edited if edited is not None else (row["arguments"] or {}),
        reason=row["reason"],
        message=None if row["status"] == Status.ALLOWED else message,
        decided_via=row["decided_via"],
        decided_by_id=row["decided_by_id"],
    )


def record_execution(
    approval_id: str, ok: bool = True, summary: str = "", *, user_id: Any = None
) -> str:
    """Record that an allowed call ran; say what happened.

    ``"executed"`` for the one report that counted; ``"not_found"`` for an
    unknown id (or, with ``user_id``, another user's call); ``"not_allowed"``
    for a call that is not allowed (pending, denied, expired, …);
    ``"already_executed"`` when it was reported before.
    """
    if not isinstance(ok, bool):
        raise ValueError(f"ok must be True or False, not {ok!r}")
    if not isinstance(summary, str):
        raise ValueError(f"summary must be a string, not {type(summary).__name__}")
    summary = summary.replace("\x00", "")[:MAX_SUMMARY_LENGTH]
    if not isinstance(approval_id, str) or not approval_id:
        return NOT_FOUND
    rows = Approval.objects.filter(approval_id=approval_id)
    if user_id is not None:
        rows = rows.filter(user_id=user_id)
    changed = rows.filter(status=Status.ALLOWED, executed_at__isnull=True).update(
        executed_at=timezone.now(), execution_ok=ok, execution_summary=summary
    )
    if changed:
        return EXECUTED
    row = rows.values("status", "executed_at").first()
    if row is None:
        return NOT_FOUND
    if row["status"] != Status.ALLOWED:
        return NOT_ALLOWED
    return ALREADY_EXECUTED
