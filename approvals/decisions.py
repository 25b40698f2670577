"""The one place a decision happens.

Every entry point (Python API, HTTP, WebSocket, admin, rules, timeout, cancel,
sweep) ends in :func:`decide`. It changes a row only with a conditional update
(``status='pending'`` and, for a person's answer, not yet expired) and counts
the rows changed: exactly one caller can win. Waiters and UIs are told only
after the transaction commits (:mod:`approvals.announce`). Deciding starts no
thread: a process that serves live traffic runs its listener already.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import connection
from django.utils import timezone

from . import announce, argschema, events, hooks, knownrows, rules
from .aftercommit import atomic_then
from .errors import (
    ALREADY_DECIDED,
    INVALID_ARGUMENTS,
    INVALID_FIELD,
    NOT_EDITABLE,
    RequestError,
    detail_for,
)
from .errors import NOT_FOUND as NOT_FOUND_CODE
from .models import REMEMBER_SCOPES, Approval, Status, Via, status_for_answer
from .permissions import may_decide_any

__all__ = ["NOT_FOUND", "Outcome", "decide", "status_for_answer"]


@dataclass(frozen=True)
class Outcome:
    """What happened to one decision attempt.

    ``won`` is true only for the caller that changed the row. ``status`` is the
    approval's status afterwards (empty when not found). ``error`` is ``""``,
    ``"not_found"`` or ``"already_decided"``.
    """

    won: bool
    status: str = ""
    error: str = ""
    approval_id: str = ""


NOT_FOUND = Outcome(False, "", NOT_FOUND_CODE)
#: Checked on every decision; ``Status.values`` builds its list on each access.
_FINAL = frozenset(Status.values) - {Status.PENDING}
_CHANNELS = frozenset(Via.values)


def decide(
    approval_id: str,
    status: str,
    *,
    via: str,
    by: Any = None,
    reason: str = "",
    session_id: str | None = None,
    viewer: Any = None,
    remember: str | None = None,
    edited_arguments: dict | None = None,
) -> Outcome:
    """Try to move one pending approval to ``status``; report who won.

    ``viewer``, when given, is the person acting: an approval they may not see
    is reported ``not_found``. ``session_id``, when given, must match. A person's
    answer (allowed/denied) only wins before ``expires_at``; a late one finds the
    call expired. ``remember`` (``"session"``/``"always"``) stores a rule in the
    same transaction as the decision. ``edited_arguments`` (only with ``allowed``)
    allows the call with a person's edit, written in the same conditional update;
    a call gated without ``editable=True`` raises :class:`RequestError`
    ``not_editable``, and arguments failing its ``arguments_schema`` raise
    ``invalid_arguments``; neither changes anything.
    """
    if status not in _FINAL:
        raise ValueError(f"not a final status: {status!r}")
    if via not in _CHANNELS:
        raise ValueError(f"not a decision channel: {via!r}")
    if remember not in (None, *REMEMBER_SCOPES):
        raise ValueError(f'remember must be "session" or "always", not {remember!r}')
    if edited_arguments is not None and status != Status.ALLOWED:
        raise ValueError("edited arguments go only with an allow")
    if not isinstance(approval_id, str) or not approval_id:
        return NOT_FOUND
    now = timezone.now()
    change = _Change(status, via, getattr(by, "pk", by), reason or "", now, remember)
    owner = getattr(viewer, "pk", None)
    alone = _alone(change)
    if edited_arguments is None and owner is not None and _one_statement():
        # The common case, a person answering their own agent's call, is one
        # statement: the update says whether it won and returns the row.
        with atomic_then([], atomic=not alone) as after:
            row = _update_own(approval_id, owner, session_id, change)
            if row is not None:
                _won(after, row, change, by, None, alone)
        if row is not None:
            return Outcome(True, status, "", approval_id)
    row = _visible_row(approval_id, session_id, viewer)
    if row is None:
        return NOT_FOUND
    if row["status"] != Status.PENDING:
        return Outcome(False, row["status"], ALREADY_DECIDED, approval_id)
    edit = _checked_edit(row, edited_arguments) if edited_arguments is not None else None
    with atomic_then([], atomic=not alone) as after:
        changed = _conditional_update(row["pk"], change, edit)
        if changed:
            _won(after, row, change, by, edit, alone)
    if changed:
        return Outcome(True, status, "", approval_id)
    return _explain_loss(row, now)


@dataclass(frozen=True)
class _Change:
    """What a decision writes: the new status, who and how, when."""

    status: str
    via: str
    by_id: Any
    reason: str
    now: Any
    remember: str | None

    @property
    def before_deadline(self) -> bool:
        """A person's answer (and abandonment) only wins before ``expires_at``."""
        return self.status in (Status.ALLOWED, Status.DENIED, Status.ABANDONED)


def _won(
    after: list, row: dict, change: _Change, by: Any, edit: dict | None, alone: bool = False
) -> None:
    """Inside the winning transaction: the remembered rule, the hooks, the event after commit.

    ``alone``: the update was the only write (:func:`_alone`), with no transaction.
    """
    status = change.status
    if change.remember and status in (Status.ALLOWED, Status.DENIED):
        rules.remember(row, status, change.remember, by, change.reason)
    if not alone:
        hooks.decided(row["pk"], status)
    event = events.tool_decision(row, status, change.via, by, change.reason, edit)
    after.append(lambda: announce.call_decided(row["pk"], event))


def _alone(change: _Change) -> bool:
    """Whether the conditional update will be the decision's only write.

    Then it runs without a transaction around it (it is atomic by itself):
    no rule to remember and no hook that would write (no webhook wants
    ``approval.decided``, say). A hook that starts wanting to write meanwhile
    misses this one decision, as it would have had it been created a moment later.
    """
    return not change.remember and not hooks.decided_writes()


def _checked_edit(row: dict, edited: Any) -> dict | None:
    """The edit to store (``None`` when it equals the proposal), or :class:`RequestError`."""
    if not isinstance(edited, dict):
        raise RequestError(INVALID_FIELD, 'The field "arguments" must be a JSON object.')
    if not row.get("editable"):
        raise RequestError(NOT_EDITABLE, detail_for(NOT_EDITABLE))
    problem = argschema.problem(edited, row.get("arguments_schema"))
    if problem is not None:
        raise RequestError(INVALID_ARGUMENTS, f"The edited arguments do not fit: {problem}")
    proposal = Approval.objects.filter(pk=row["pk"]).values_list("arguments", flat=True).first()
    return None if edited == proposal else edited


def _conditional_update(pk: Any, change: _Change, edit: dict | None = None) -> int:
    """``UPDATE … WHERE pk = … AND status = 'pending' [AND expires_at > now]``; rows changed.

    Written as one prepared statement rather than through the queryset API: it
    is the hot path of every decision, and the ORM's query building costs more
    than the statement itself.
    """
    sql, params = _update_sql(change, edit, [("pk", pk)])
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


def _update_own(
    approval_id: str, owner: Any, session_id: str | None, change: _Change
) -> dict | None:
    """``UPDATE … WHERE approval_id = … AND user = owner AND status = 'pending' …
    RETURNING …``: the row when this caller won, else ``None`` (and nothing changed)."""
    where: list[tuple[str, Any]] = [("approval_id", approval_id), ("user", owner)]
    if session_id is not None:
        where.append(("session_id", session_id))
    sql, params = _update_sql(change, None, where)
    returning = knownrows.STORED.returning(connection.alias)
    with connection.cursor() as cursor:
        cursor.execute(f"{sql} RETURNING {returning}", params)
        rows = cursor.fetchall()
    if len(rows) != 1:
        return None
    row = knownrows.STORED.row(rows[0], connection.alias)
    return {**row, "status": Status.PENDING}  # what it was: the update saw it pending


def _update_sql(change: _Change, edit: dict | None, where: list[tuple[str, Any]]):
    """The conditional update's SQL and parameters, matching the ``where`` fields."""
    meta = Approval._meta
    when = connection.ops.adapt_datetimefield_value(change.now)
    # Keys go through their fields, so UUID and other key types are stored and
    # compared the way this backend stores them.
    by_value = meta.get_field("decided_by").get_db_prep_save(change.by_id, connection)
    params = [change.status, change.via, by_value, change.reason, when]
    if edit is not None:
        params.append(meta.get_field("edited_arguments").get_db_prep_save(edit, connection))
    for name, value in where:
        field = meta.pk if name == "pk" else meta.get_field(name)
        params.append(field.get_db_prep_save(value, connection))
    params.append(Status.PENDING)
    if change.before_deadline:
        params.append(when)
    shape = (connection.vendor, edit is not None, tuple(name for name, _ in where))
    sql = _update_text(*shape, change.before_deadline)
    return sql, params


_texts: dict[tuple, str] = {}


def _update_text(vendor: str, edited: bool, where: tuple[str, ...], deadline: bool) -> str:
    """The update's text for one shape, composed once (the parameters follow its order)."""
    key = (vendor, edited, where, deadline)
    text = _texts.get(key)
    if text is None:
        col = _columns(connection)
        sets = ["status", "decided_via", "decided_by", "reason", "decided_at"]
        if edited:
            sets.append("edited_arguments")
        conditions = [f"{col[name]} = %s" for name in (*where, "status")]
        if deadline:
            conditions.append(f"{col['expires_at']} > %s")
        assignments = ", ".join(f"{col[name]} = %s" for name in sets)
        text = f"UPDATE {col['']} SET {assignments} WHERE {' AND '.join(conditions)}"
        _texts[key] = text
    return text


_quoted: dict[str, dict[str, str]] = {}


def _columns(conn: Any) -> dict[str, str]:
    """Quoted column names by field name (and ``"pk"``; ``""``: the table), per vendor."""
    col = _quoted.get(conn.vendor)
    if col is None:
        quote = conn.ops.quote_name
        meta = Approval._meta
        col = {f.name: quote(f.column) for f in meta.concrete_fields}
        col["pk"] = quote(meta.pk.column)
        col[""] = quote(meta.db_table)
        _quoted[conn.vendor] = col
    return col


def _one_statement() -> bool:
    """Whether a person's own call is decided by one ``UPDATE … RETURNING``.

    On PostgreSQL, yes: an update that matches no row locks nothing. Not on
    SQLite, although it has ``RETURNING`` (3.35+): any update there takes the
    database's one write lock, so an unknown id or another user's call would
    wait behind every writer, where a read answers at once; it reads first,
    with a prepared statement (:func:`knownrows.stored`).
    """
    return connection.vendor == "postgresql"


def _visible_row(approval_id: str, session_id: str | None, viewer: Any) -> dict | None:
    row = knownrows.row_for(approval_id)
    found = row is not None and (session_id is None or row["session_id"] == session_id)
    if viewer is None:
        return row if found else None
    if found and str(row["user_id"]) == str(viewer.pk):
        return row  # their own call: no permission look-up
    # Unknown, in another session, or another user's: the same work on every path
    # (a stored read and the permission look-up), so how long the answer takes
    # tells nothing about whether someone else's call exists.
    if row is not None and row.get("known"):
        knownrows.stored(approval_id)
    decider = may_decide_any(viewer)
    return row if found and decider else None


def _explain_loss(row: dict, now) -> Outcome:
    status = Approval.objects.filter(pk=row["pk"]).values_list("status", flat=True).first()
    if status is None:  # known to this process, but its transaction was rolled back
        return NOT_FOUND
    if status == Status.PENDING:
        # Still pending but past its deadline: it is expired; record that first.
        expired = decide(row["approval_id"], Status.EXPIRED, via=Via.TIMEOUT)
        status = expired.status or Status.EXPIRED
    return Outcome(False, status or "", ALREADY_DECIDED, row["approval_id"])
