"""One model instance read by its key, with a statement composed once per database.

Every signed-in request reads its session row and its user row before the view
runs. Through the queryset API each such ``get()`` costs about 0.3–0.4 ms of
Python, most of it building and compiling the query; the statement itself is
tens of microseconds. Here the ``SELECT`` of the model's own concrete fields is
composed once per (model, database, lookup) and each read runs it with fresh
parameters. Parameters go through the fields as a lookup's would
(``get_prep_value``, then ``get_db_prep_value``), and each value read goes
through the converters Django's ORM applies, so the instance is the one
``get()`` returns (``from_db``, ``_state.db`` set, nothing deferred).

Only models whose fields all live in one table qualify (no multi-table
inheritance); :func:`composable` says which. Callers fall back to the ORM for
the others.

:func:`get_joined` reads a second row by its primary key in the same
statement (a ``LEFT JOIN`` on a constant): a session and the user it was last
seen signed in as, one round trip instead of two (:mod:`approvals.sessionuser`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import connections
from django.db.models import QuerySet
from django.db.models.query import ModelIterable

Converter = Callable[[Any, Any, Any], Any]


@dataclass(frozen=True)
class _Statement:
    sql: str
    names: list[str]  # attribute names, in column order
    columns: list[tuple[Any, list[Converter]]]  # expression and converters per column
    key: Any  # the key field
    later: Any  # the field compared with ``>``, or None
    joined: Any = None  # the second model's statement part (get_joined), or None


#: Returned by :func:`get_joined` for the second row when the first was not found.
NOT_READ = object()


_built: dict[tuple, _Statement] = {}
_lock = threading.Lock()


def composable(model: type) -> bool:
    """Whether ``model``'s rows can be read here: all its fields in its own table."""
    meta = model._meta
    return not meta.parents and all(f.model is meta.concrete_model for f in meta.concrete_fields)


def plain(model: type) -> bool:
    """Whether ``model`` is :func:`composable` and its default manager's queryset is
    the whole table, unchanged (no filter, ``select_related``, queryset class of
    its own…): then a composed read returns exactly the rows the manager would."""
    if not composable(model):
        return False
    qs = model._default_manager.get_queryset()
    query = qs.query
    return (
        type(qs) is QuerySet
        and qs._iterable_class is ModelIterable
        and not qs._prefetch_related_lookups
        and not query.where
        and not query.select_related
        and not query.annotations
        and not query.extra
        and not query.distinct
        and query.deferred_loading == (frozenset(), True)
        and query.low_mark == 0
        and query.high_mark is None
    )


def get(model: type, using: str, key: str, value: Any, later: tuple[str, Any] | None = None):
    """``model.objects.get(<key>=value[, <later[0]>__gt=later[1]])``, or ``None`` when no row.

    ``key`` names a unique field (``"pk"`` for the primary key) compared for
    equality; ``later``, if given, a field and a value the row's must exceed.
    """
    statement = _statement(model, using, key, later[0] if later else None)
    connection = connections[using]
    found = _fetch(statement, connection, [], value, later)
    if found is None:
        return None
    values = converted(found, statement.columns, connection)
    return model.from_db(using, statement.names, values)


def get_joined(
    model: type,
    using: str,
    key: str,
    value: Any,
    later: tuple[str, Any] | None,
    other: type,
    other_pk: Any,
) -> tuple[Any, Any]:
    """:func:`get` and ``other.objects.get(pk=other_pk)`` in one statement.

    Returns ``(row, other_row)``: ``row`` as :func:`get` returns it; ``other_row``
    the ``other`` instance, ``None`` when no such row exists, or
    :data:`NOT_READ` when ``row`` was not found (nothing was joined then).
    Both models must be :func:`composable` and on the same database.
    """
    statement = _statement(model, using, key, later[0] if later else None, other)
    joined = statement.joined
    connection = connections[using]
    first = [_prepared(joined.key, other_pk, connection)]  # the join's, before the WHERE's
    found = _fetch(statement, connection, first, value, later)
    if found is None:
        return None, NOT_READ
    width = len(statement.names)
    values = converted(found[:width], statement.columns, connection)
    row = model.from_db(using, statement.names, values)
    rest = found[width:]
    if rest[joined.names.index(joined.key.attname)] is None:
        return row, None  # the LEFT JOIN found no such row
    other_values = converted(rest, joined.columns, connection)
    return row, other.from_db(using, joined.names, other_values)


def column(col: Any, connection: Any) -> tuple[Any, list[Converter]]:
    """A selected column and the converters the ORM applies to its values."""
    return col, connection.ops.get_db_converters(col) + col.get_db_converters(connection)


def converted(found: tuple, columns: list, connection: Any) -> list:
    """The values of a row read as ``columns`` (from :func:`column`), as the ORM gives them."""
    values = []
    for (expression, converters), value in zip(columns, found, strict=True):
        for convert in converters:
            value = convert(value, expression, connection)
        values.append(value)
    return values


def _fetch(statement: _Statement, connection: Any, params: list, value: Any, later) -> Any:
    """Run ``statement`` with ``params`` then the key's and ``later``'s; its one row or None."""
    params = [*params, _prepared(statement.key, value, connection)]
    if later is not None:
        params.append(_prepared(statement.later, later[1], connection))
    with connection.cursor() as cursor:
        cursor.execute(statement.sql, params)
        return cursor.fetchone()


def _prepared(field: Any, value: Any, connection: Any) -> Any:
    """A lookup's parameter for ``field``, as the ORM's exact and ``gt`` lookups prepare it."""
    return field.get_db_prep_value(field.get_prep_value(value), connection, prepared=True)


def _statement(
    model: type, using: str, key: str, later: str | None, other: type | None = None
) -> _Statement:
    cache_key = (model, using, key, later, other)
    built = _built.get(cache_key)
    if built is None:
        with _lock:
            built = _built.get(cache_key) or _compose(model, connections[using], key, later, other)
            _built[cache_key] = built
    return built


def _compose(
    model: type, connection: Any, key: str, later: str | None, other: type | None = None
) -> _Statement:
    """The statement; with ``other``, its columns follow, ``LEFT JOIN``-ed on its
    primary key = a parameter that comes before the ``WHERE``'s."""
    meta = model._meta
    quote = connection.ops.quote_name
    table = quote(meta.db_table)
    key_field = meta.pk if key == "pk" else meta.get_field(key)
    if not key_field.unique:
        raise ValueError(f"{meta.label}.{key_field.name} is not unique")
    columns = [column(f.get_col(meta.db_table), connection) for f in meta.concrete_fields]
    selected = _selected(meta, quote)
    source = table
    joined = None
    if other is not None:
        if other._meta.db_table == meta.db_table:
            raise ValueError("a model cannot be joined with itself")
        joined = _compose(other, connection, "pk", None)
        other_table = quote(other._meta.db_table)
        selected += ", " + _selected(other._meta, quote)
        on = f"{other_table}.{quote(other._meta.pk.column)} = %s"
        source += f" LEFT JOIN {other_table} ON {on}"
    sql = f"SELECT {selected} FROM {source} WHERE {table}.{quote(key_field.column)} = %s"
    later_field = meta.get_field(later) if later is not None else None
    if later_field is not None:
        sql += f" AND {table}.{quote(later_field.column)} > %s"
    names = [field.attname for field in meta.concrete_fields]
    return _Statement(sql, names, columns, key_field, later_field, joined)


def _selected(meta: Any, quote: Callable[[str], str]) -> str:
    table = quote(meta.db_table)
    return ", ".join(f"{table}.{quote(f.column)}" for f in meta.concrete_fields)
