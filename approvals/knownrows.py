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

    A prepared statement rather than a queryset: every decision on a call gated
    in another process reads this, and building the query would cost more than
    running it. Values go through the converters the ORM would apply.
    """
    fields = columns()
    names = ", ".join(connection.ops.quote_name(f.column) for f in fields)
    table = connection.ops.quote_name(Approval._meta.db_table)
    key = connection.ops.quote_name(Approval._meta.get_field("approval_id").column)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {names} FROM {table} WHERE {key} = %s", [approval_id])
        found = cursor.fetchone()
    if found is None:
        return None
    return dict(zip((*FIELDS, "status"), map(converted, fields, found), strict=True))


def columns() -> list:
    """The model fields behind :data:`FIELDS` and ``status``, in that order."""
    meta = Approval._meta
    by_name = {"pk": meta.pk, "user_id": meta.get_field("user")}
    return [by_name.get(name) or meta.get_field(name) for name in (*FIELDS, "status")]


def converted(field: Any, value: Any) -> Any:
    """A column read by a prepared statement as the ORM would have read it (booleans
    and JSON on SQLite, UUIDs, …)."""
    key = (connection.alias, field.name)
    found = _converters.get(key)
    if found is None:
        expression = field.get_col(Approval._meta.db_table)
        converters = connection.ops.get_db_converters(expression)
        converters += expression.get_db_converters(connection)
        found = _converters[key] = (expression, converters)
    expression, converters = found
    for convert in converters:
        value = convert(value, expression, connection)
    return value


_converters: dict[tuple[str, str], tuple[Any, list]] = {}
