"""One approval row read by its approval id, in one statement built once per database.

A PostgreSQL notification names one row, and the sockets of the process that
got it need that row's fields now: the read runs on the watcher thread, ahead of
the frame it feeds. Through the queryset API (filter, annotate, values) it took
about 0.65 ms a notification, two thirds of it building the query; here the
statement is composed once per database from the model's metadata (tables,
columns, the user model's username field) and each read costs about 0.2 ms,
mostly the round trip. Each value goes through the converters Django's ORM
applies to it, so the row is the one ``values()`` returns.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from django.db import connections, router

from . import events, keyread
from .models import Approval, Status

#: The fields of ``tool_start`` (see :mod:`approvals.events`).
START_FIELDS = ("pk", "user_id", "status", *events.PENDING_FIELDS)
#: The fields of ``tool_decision``.
DECISION_FIELDS = (
    "approval_id",
    "session_id",
    "user_id",
    "status",
    "decided_via",
    "reason",
    "edited_arguments",
)

Converter = Callable[[Any, Any, Any], Any]


class RowReader:
    """``read(approval_id)``: the fields of one row as a dict, or ``None``.

    ``fields`` name the approval's fields (``"pk"``, an attribute name such as
    ``"user_id"``, or one step across a foreign key such as ``"agent_key__name"``);
    ``names`` adds ``{key: "fk"}``: that key is the username of the user ``fk``
    points to. With ``decided``, a pending row counts as none.
    """

    def __init__(self, fields: tuple[str, ...], names: dict[str, str], decided: bool) -> None:
        self.fields = fields
        self.names = names
        self.decided = decided
        # Per database: the statement, the keys, and each column's expression and converters.
        self._built: dict[str, tuple[str, list[str], list[tuple[Any, list[Converter]]]]] = {}
        self._lock = threading.Lock()

    def read(self, approval_id: str, using: str | None = None) -> dict | None:
        """The row of ``approval_id`` on ``using`` (default: where the router reads approvals)."""
        using = using or router.db_for_read(Approval)
        sql, keys, columns = self._statement(using)
        connection = connections[using]
        params = [approval_id, Status.PENDING] if self.decided else [approval_id]
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            found = cursor.fetchone()
        return None if found is None else _row(keys, found, columns, connection)

    def returning(self, using: str) -> str:
        """This reader's columns for an ``UPDATE … RETURNING`` on the approvals table
        (a reader without ``names`` or ``__`` fields); :meth:`row` reads what it returns."""
        _, _, columns = self._statement(using)
        quote = connections[using].ops.quote_name
        return ", ".join(quote(expression.target.column) for expression, _ in columns)

    def row(self, found: tuple, using: str) -> dict:
        """The dict :meth:`read` gives, from a row of these columns selected elsewhere."""
        _, keys, columns = self._statement(using)
        return _row(keys, found, columns, connections[using])

    def _statement(self, using: str) -> tuple[str, list[str], list]:
        built = self._built.get(using)
        if built is None:
            with self._lock:
                built = self._built.get(using) or _compose(self, connections[using])
                self._built[using] = built
        return built


def _row(keys: list[str], found: tuple, columns: list, connection: Any) -> dict:
    return dict(zip(keys, keyread.converted(found, columns, connection), strict=True))


def _compose(reader: RowReader, connection: Any) -> tuple[str, list[str], list]:
    """The statement, the keys, and per selected column its expression and converters."""
    quote = connection.ops.quote_name
    meta = Approval._meta
    joins: dict[str, tuple[str, Any]] = {}  # foreign key name -> (alias, related model)

    def joined(fk_name: str) -> tuple[str, Any]:
        if fk_name not in joins:
            fk = meta.get_field(fk_name)
            alias = f"j{len(joins)}"
            joins[fk_name] = (alias, fk)
        alias, fk = joins[fk_name]
        return alias, fk.related_model

    selected = []
    for key in reader.fields:
        if "__" in key:
            fk_name, _, name = key.partition("__")
            alias, model = joined(fk_name)
            selected.append((key, model._meta.get_field(name).get_col(alias)))
        else:
            field = meta.pk if key == "pk" else _field_by_attname(meta, key)
            selected.append((key, field.get_col("a")))
    for key, fk_name in reader.names.items():
        alias, model = joined(fk_name)
        username = model._meta.get_field(model.USERNAME_FIELD)
        selected.append((key, username.get_col(alias)))
    parts = [f"{quote(col.alias)}.{quote(col.target.column)}" for _, col in selected]
    columns = [keyread.column(col, connection) for _, col in selected]
    sql = f"SELECT {', '.join(parts)} FROM {quote(meta.db_table)} {quote('a')}"
    for alias, fk in joins.values():
        target = fk.related_model._meta
        sql += (
            f" LEFT JOIN {quote(target.db_table)} {quote(alias)} ON {quote(alias)}."
            f"{quote(fk.target_field.column)} = {quote('a')}.{quote(fk.column)}"
        )
    sql += f" WHERE {quote('a')}.{quote(meta.get_field('approval_id').column)} = %s"
    if reader.decided:
        sql += f" AND {quote('a')}.{quote(meta.get_field('status').column)} <> %s"
    return sql, [key for key, _ in selected], columns


def _field_by_attname(meta: Any, attname: str) -> Any:
    for field in meta.concrete_fields:
        if field.attname == attname:
            return field
    return meta.get_field(attname)


#: ``tool_start``'s row, with ``owner`` (the call's user's username).
STARTS = RowReader(START_FIELDS, {"owner": "user"}, decided=False)
#: A decided row for ``tool_decision``, with ``decided_by_name``.
DECISIONS = RowReader(DECISION_FIELDS, {"decided_by_name": "decided_by"}, decided=True)
