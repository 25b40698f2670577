"""Recording that an allowed call ran: once, and only when it was allowed.

:func:`mark_executed` is the one conditional update behind
``gate.mark_executed`` and the agent API's ``executed`` endpoint:
``UPDATE … WHERE status = 'allowed' AND executed_at IS NULL``; one row
changed means this report counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.utils import timezone

from .models import Approval, Status

NOT_FOUND = "not_found"
NOT_ALLOWED = "not_allowed"
ALREADY_EXECUTED = "already_executed"


@dataclass(frozen=True)
class Executed:
    """What one report did: ``recorded`` only for the report that counted.

    ``error`` is ``""``, ``"not_found"``, ``"not_allowed"`` or ``"already_executed"``;
    ``status`` is the call's status (empty when not found).
    """

    recorded: bool
    status: str = ""
    error: str = ""


def mark_executed(
    approval_id: str, ok: bool = True, summary: str = "", *, user_id: Any = None
) -> Executed:
    """Record that the allowed call ``approval_id`` ran (``ok``, ``summary``), once.

    ``user_id``, when given, narrows it to that user's calls (another user's is
    "not found").
    """
    if not isinstance(ok, bool):
        raise ValueError(f"ok must be True or False, not {ok!r}")
    if not isinstance(summary, str):
        raise ValueError(f"summary must be a string, not {type(summary).__name__}")
    rows = Approval.objects.filter(approval_id=approval_id)
    if user_id is not None:
        rows = rows.filter(user_id=user_id)
    changed = rows.filter(status=Status.ALLOWED, executed_at__isnull=True).update(
        executed_at=timezone.now(), execution_ok=ok, execution_summary=summary
    )
    if changed:
        return Executed(True, Status.ALLOWED)
    row = rows.values("status", "executed_at").first()
    if row is None:
        return Executed(False, "", NOT_FOUND)
    if row["status"] != Status.ALLOWED:
        return Executed(False, row["status"], NOT_ALLOWED)
    return Executed(False, row["status"], ALREADY_EXECUTED)
