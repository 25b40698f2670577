"""The one place a decision happens.

Every entry point (Python API, HTTP, WebSocket, admin, rules, timeout, cancel,
sweep) ends in :func:`decide`. It changes a row only with a conditional update
(``status='pending'`` and, for a person's answer, not yet expired) and counts
the rows changed: exactly one caller can win. Waiters and UIs are told only
after the transaction commits.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from . import events, signals
from .models import Approval, Status, Via

#: Decisions a person (or a rule) can make, by the words callers use.
ANSWERS = {"allow": Status.ALLOWED, "deny": Status.DENIED}
REMEMBER_SCOPES = ("session", "always")


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


NOT_FOUND = Outcome(False, "", "not_found")


def may_decide_any(user: Any) -> bool:
    """True when ``user`` may see and decide every approval, not only their own."""
    return bool(user is not None and user.has_perm("approvals.decide_approval"))


def visible_to(user: Any):
    """A queryset of the approvals ``user`` may see and decide."""
    qs = Approval.objects.all()
    if may_decide_any(user):
        return qs
    return qs.filter(user_id=user.pk)


def status_for_answer(decision: Any) -> str:
    """Map ``"allow"``/``"deny"`` to a status; anything else raises ``ValueError``."""
    if not isinstance(decision, str) or decision not in ANSWERS:
        raise ValueError(f'decision must be "allow" or "deny", not {decision!r}')
    return ANSWERS[decision]


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
) -> Outcome:
    """Try to move one pending approval to ``status``; report who won.

    ``viewer``, when given, is the person acting: an approval they may not see
    is reported ``not_found``. ``session_id``, when given, must match. A person's
    answer (allowed/denied) only wins before ``expires_at``; a late one finds the
    call expired. ``remember`` (``"session"``/``"always"``) stores a rule in the
    same transaction as the decision.
    """
    if status not in Status.values or status == Status.PENDING:
        raise ValueError(f"not a final status: {status!r}")
    if via not in Via.values:
        raise ValueError(f"not a decision channel: {via!r}")
    if remember not in (None, *REMEMBER_SCOPES):
        raise ValueError(f'remember must be "session" or "always", not {remember!r}')
    if not isinstance(approval_id, str) or not approval_id:
        return NOT_FOUND
    row = _visible_row(approval_id, session_id, viewer)
    if row is None:
        return NOT_FOUND
    if row["status"] != Status.PENDING:
        return Outcome(False, row["status"], "already_decided", approval_id)

    now = timezone.now()
    by_id = getattr(by, "pk", by)
    before_deadline = status in (Status.ALLOWED, Status.DENIED, Status.ABANDONED)
    with atomic_then([]) as after:
        changed = _conditional_update(
            row["pk"], status, via, by_id, reason or "", now, before_deadline
        )
        if changed and remember and status in (Status.ALLOWED, Status.DENIED):
            from . import rules

            rules.remember(row, status, remember, by, reason or "")
        if changed:
            event = events.tool_decision(row, status, via, by, reason or "")
            after.append(lambda: _announce(row["pk"], event))
    if changed:
        return Outcome(True, status, "", approval_id)
    return _explain_loss(row, now)


def _conditional_update(pk, status, via, by_id, reason, now, before_deadline) -> int:
    """``UPDATE … WHERE status = 'pending' [AND expires_at > now]``; the rows changed.

    Written as one prepared statement rather than through the queryset API: it
    is the hot path of every decision, and the ORM's query building costs more
    than the statement itself.
    """
    ops = connection.ops
    meta = Approval._meta
    col = {f.name: ops.quote_name(f.column) for f in meta.concrete_fields}
    sql = (
        f"UPDATE {ops.quote_name(meta.db_table)} SET {col['status']} = %s, "
        f"{col['decided_via']} = %s, {col['decided_by']} = %s, {col['reason']} = %s, "
        f"{col['decided_at']} = %s "
        f"WHERE {ops.quote_name(meta.pk.column)} = %s AND {col['status']} = %s"
    )
    when = ops.adapt_datetimefield_value(now)
    # The user's key goes through its field, so UUID and other key types are stored
    # the way this backend stores them.
    by_value = meta.get_field("decided_by").get_db_prep_save(by_id, connection)
    params = [status, via, by_value, reason, when, pk, Status.PENDING]
    if before_deadline:
        sql += f" AND {col['expires_at']} > %s"
        params.append(when)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


@contextmanager
def atomic_then(callbacks: list):
    """An atomic block whose ``callbacks`` run once it has committed.

    Inside only a test case's wrapping transaction (which never commits) they
    run when this block ends, so waiters in such tests wake as in production.
    """
    under_testcase = connection.in_atomic_block and all(
        getattr(block, "_from_testcase", False) for block in connection.atomic_blocks
    )
    with transaction.atomic():
        yield callbacks
        if not under_testcase:
            for fn in callbacks:
                transaction.on_commit(fn, robust=True)
    if under_testcase:
        for fn in callbacks:
            fn()


_ROW_FIELDS = ("pk", "approval_id", "session_id", "user_id", "tool_name", "tool_call_id")
_known_rows: OrderedDict[str, dict] = OrderedDict()
_KNOWN_ROWS_MAX = 20_000
_known_lock = threading.Lock()


def remember_row(approval: Approval) -> None:
    """Keep a gated call's fixed fields, so deciding it in this process skips a read."""
    row = {name: getattr(approval, name) for name in _ROW_FIELDS}
    with _known_lock:
        _known_rows[approval.approval_id] = row
        while len(_known_rows) > _KNOWN_ROWS_MAX:
            _known_rows.popitem(last=False)


def _visible_row(approval_id: str, session_id: str | None, viewer: Any) -> dict | None:
    # The fields used here never change once a row is written, so a copy kept
    # by this process is as good as a read; the status is settled by the
    # conditional update either way.
    with _known_lock:
        known = _known_rows.get(approval_id)
    if known is not None:
        row = {**known, "status": Status.PENDING}
    else:
        row = (
            Approval.objects.filter(approval_id=approval_id)
            .values(*_ROW_FIELDS, "status")
            .order_by()
            .first()
        )
    if row is None or (session_id is not None and row["session_id"] != session_id):
        return None
    if viewer is not None and not _may_see(viewer, row["user_id"]):
        return None
    return row


def _may_see(viewer: Any, owner_id: Any) -> bool:
    # Their own call needs no permission lookup (the common case: two queries saved).
    if owner_id is not None and str(owner_id) == str(viewer.pk):
        return True
    return may_decide_any(viewer)


def _explain_loss(row: dict, now) -> Outcome:
    status = Approval.objects.filter(pk=row["pk"]).values_list("status", flat=True).first()
    if status is None:  # known to this process, but its transaction was rolled back
        return NOT_FOUND
    if status == Status.PENDING:
        # Still pending but past its deadline: it is expired; record that first.
        expired = decide(row["approval_id"], Status.EXPIRED, via=Via.TIMEOUT)
        status = expired.status or Status.EXPIRED
    return Outcome(False, status or "", "already_decided", row["approval_id"])


def _announce(pk: int, event: dict) -> None:
    from . import listener

    listener.dispatch(event)
    if signals.approval_decided.has_listeners(Approval):
        approval = Approval.objects.select_related("decided_by").get(pk=pk)
        signals.approval_decided.send(
            sender=Approval,
            approval=approval,
            status=approval.status,
            decided_via=approval.decided_via,
            decided_by=approval.decided_by,
        )


def announce_created(approval: Approval) -> None:
    """After the row of a newly gated call commits: tell sockets, processes and receivers."""
    from . import listener

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
        signals.approval_decided.send(
            sender=Approval,
            approval=approval,
            status=approval.status,
            decided_via=approval.decided_via,
            decided_by=None,
        )


def expire_overdue(limit: int = 1000) -> int:
    """Record ``expired`` (via ``sweep``) for pending calls past their deadline."""
    now = timezone.now()
    ids = list(
        Approval.objects.filter(status=Status.PENDING, expires_at__lte=now)
        .order_by("expires_at")
        .values_list("approval_id", flat=True)[:limit]
    )
    return sum(decide(aid, Status.EXPIRED, via=Via.SWEEP).won for aid in ids)


def abandon_orphans(lease_timeout: float, limit: int = 1000) -> int:
    """Record ``abandoned`` (via ``sweep``) for pending calls whose waiting process is gone."""
    from .models import ProcessLease

    cutoff = timezone.now() - timedelta(seconds=lease_timeout)
    alive = ProcessLease.objects.filter(heartbeat_at__gt=cutoff).values("key")
    # A call younger than the lease timeout is never judged: its process may
    # simply not have beaten yet (or be re-writing a lease that went missing).
    ids = list(
        Approval.objects.filter(status=Status.PENDING, created_at__lt=cutoff)
        .exclude(waiter="")
        .exclude(waiter__in=alive)
        .order_by("created_at")
        .values_list("approval_id", flat=True)[:limit]
    )
    won = sum(decide(aid, Status.ABANDONED, via=Via.SWEEP).won for aid in ids)
    ProcessLease.objects.filter(heartbeat_at__lte=cutoff - timedelta(hours=1)).delete()
    return won
