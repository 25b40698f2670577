"""The CSV export an auditor takes away: every audit column, streamed."""

from __future__ import annotations

import csv
import json
from typing import Any

from django.db.models import QuerySet
from django.http import StreamingHttpResponse
from django.utils import timezone

from ..models import Approval

CSV_COLUMNS = (
    "approval_id",
    "session_id",
    "user",
    "tool_name",
    "tool_call_id",
    "arguments",
    "status",
    "decided_via",
    "decided_by",
    "reason",
    "created_at",
    "decided_at",
    "expires_at",
    "seconds_to_decision",
    "description",
    "editable",
    "edited_arguments",
    "executed_at",
    "execution_ok",
    "execution_summary",
    "agent_key",
)


class _Echo:
    def write(self, value: str) -> str:
        return value


def _csv_cell(value: Any) -> str:
    if value is None:
        return ""
    text = str(value)
    # A spreadsheet would run a cell starting like a formula; agents write these values.
    if text[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + text
    return text


def _csv_row(a: Approval) -> list[str]:
    waited = a.time_to_decision
    values = (
        a.approval_id,
        a.session_id,
        a.user.get_username() if a.user else "",
        a.tool_name,
        a.tool_call_id,
        json.dumps(a.arguments, ensure_ascii=False, sort_keys=True),
        a.status,
        a.decided_via,
        a.decided_by.get_username() if a.decided_by else "",
        a.reason,
        a.created_at.isoformat(),
        a.decided_at.isoformat() if a.decided_at else "",
        a.expires_at.isoformat(),
        f"{waited.total_seconds():.3f}" if waited is not None else "",
        a.description,
        "yes" if a.editable else "no",
        _json_or_blank(a.edited_arguments),
        a.executed_at.isoformat() if a.executed_at else "",
        {True: "yes", False: "no"}.get(a.execution_ok, ""),
        a.execution_summary,
        a.agent_key.name if a.agent_key_id else "",
    )
    return [_csv_cell(v) for v in values]


def _json_or_blank(value: Any) -> str:
    return "" if value is None else json.dumps(value, ensure_ascii=False, sort_keys=True)


def csv_rows(queryset: QuerySet):
    """The header, then one row per approval, oldest first (fetched in chunks)."""
    yield list(CSV_COLUMNS)
    rows = queryset.select_related("user", "decided_by", "agent_key").order_by("created_at", "pk")
    for approval in rows.iterator(chunk_size=2000):
        yield _csv_row(approval)


def csv_response(queryset: QuerySet) -> StreamingHttpResponse:
    """A streamed CSV download of ``queryset`` with every audit column."""
    writer = csv.writer(_Echo())
    stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
    response = StreamingHttpResponse(
        (writer.writerow(row) for row in csv_rows(queryset)),
        content_type="text/csv; charset=utf-8",
    )
    response["Content-Disposition"] = f'attachment; filename="approvals-{stamp}.csv"'
    return response
