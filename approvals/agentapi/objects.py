"""The approval object: one call as the agent API and the webhooks show it."""

from __future__ import annotations

from typing import Any

from .. import events, gate
from ..models import Approval, Status, answer_for_status

#: The row fields the object is made from (one ``.values()`` query).
OBJECT_FIELDS = (
    "approval_id",
    "session_id",
    "tool_name",
    "tool_call_id",
    "arguments",
    "edited_arguments",
    "description",
    "editable",
    "status",
    "decided_via",
    "reason",
    "created_at",
    "expires_at",
    "decided_at",
    "executed_at",
)


def approval_object(row: Any) -> dict:
    """The approval object of ``row`` (an ``Approval`` or a dict of :data:`OBJECT_FIELDS`).

    ``decision`` is ``"allow"``/``"deny"`` once decided (``null`` while pending);
    ``message`` is what to feed the model when the call did not run
    (:func:`approvals.gate.denial_message`), ``null`` while pending or when allowed.
    """
    get = row.get if isinstance(row, dict) else lambda name: getattr(row, name)
    body = {name: get(name) for name in OBJECT_FIELDS}
    status = body["status"]
    pending = status == Status.PENDING
    body["decision"] = None if pending else str(answer_for_status(status))
    body["message"] = (
        None if pending or status == Status.ALLOWED else gate.message_for(status, body["reason"])
    )
    body["status"] = str(status)
    body["decided_via"] = str(body["decided_via"])
    for name in ("created_at", "expires_at", "decided_at", "executed_at"):
        body[name] = events.iso(body[name])
    return body


def object_for(approval_id: str, user_id: Any) -> dict | None:
    """The approval object of ``user_id``'s call ``approval_id``; ``None`` for any other."""
    row = (
        Approval.objects.filter(approval_id=approval_id, user_id=user_id)
        .values(*OBJECT_FIELDS)
        .first()
    )
    return None if row is None else approval_object(row)
