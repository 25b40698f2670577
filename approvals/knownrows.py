"""The fixed fields of calls gated in this process, so deciding them skips a read.

The fields kept never change once a row is written, so a copy is as good as a
read; the status is settled by the decision's conditional update either way.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from django.db import connection

from .models import Approval, Status
from .rowread import RowReader

FIELDS = (
    "pk",
    "approval_id",
    "session_id",
    "user_id",
    "tool_name",
    "tool_call_id",
    "editable",
    "arguments_schema",
)
_MAX = 20_000
_rows: OrderedDict[str, dict] = OrderedDict()
_lock = threading.Lock()


def remember(approval: Approval) -> None:
    """Keep a gated call's fixed fields (the oldest are forgotten past 20,000)."""
    row = {name: getattr(approval, name) for name in FIELDS}
    with _lock:
        _rows[approval.approval_id] = row
        while len(_rows) > _MAX:
            _rows.popitem(last=False)


def row_for(approval_id: str) -> dict[str, Any] | None:
    """The call's fixed fields and a status (``pending`` when known here, else as read)."""
    with _lock:
        known = _rows.get(approval_id)
    if known is not None:
        return {**known, "status": Status.PENDING, "known": True}
    return stored(approval_id)


def stored(approval_id: str) -> dict[str, Any] | None:
    """The call's fixed fields and status as the database has them (one query).

    A statement composed once (:mod:`approvals.rowread`) rather than a queryset:
    every decision on a call gated in another process reads this, and building
    the query would cost more than running it.
    """
    return STORED.read(approval_id, connection.alias)


#: The fixed fields and the status, read by approval id.
STORED = RowReader((*FIELDS, "status"), {}, decided=False)
