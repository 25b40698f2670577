"""The database tail: rows created or decided since this process last looked.

Without a cross-process channel layer this is how a process learns of calls
gated and decided elsewhere; with one, it is the safety net behind it. One
query per look for the whole process, never one per waiter or per socket.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import F
from django.utils import timezone

from . import events, rowread
from .models import Approval, Status

_HOLE_SECONDS = 30.0
#: At most this many ids below a new row are watched as holes: ids handed out to
#: transactions still open are a handful; a wide gap (rows deleted, a sequence
#: that jumped) is not waited for, so a pass never carries a long id list.
_HOLES_MAX = 256
_DECIDED_OVERLAP = timedelta(seconds=10)
#: How far back a quick look reaches (the passes a database watcher asks for,
#: up to one per commit): rows decided lately are read whole, and reading ten
#: seconds of them on every commit costs a busy process more than its decisions.
#: A commit later than this after its ``decided_at`` (a long wait for SQLite's
#: write lock, a bulk action) is found by the next full look, within
#: ``RECHECK_INTERVAL``.
_QUICK_OVERLAP = timedelta(seconds=0.25)
_START_OVERLAP = timedelta(seconds=5)


def decided_among(approval_ids: list[str]) -> list[dict]:
    """``tool_decision`` events for the ids among ``approval_ids`` that are decided.

    The listener asks this of every waiting id now and then (10,000 for a busy
    agent), and almost always none is decided: a first pass reads only the
    decided ids, with a plain statement per 500 ids (no query building per
    id), and only those found are read in full.
    """
    found: list[str] = []
    for start in range(0, len(approval_ids), 500):
        found.extend(_decided_ids(approval_ids[start : start + 500]))
    return _read_decided(found)


def _read_decided(approval_ids: list[str]) -> list[dict]:
    """``tool_decision`` events for these ids (those still pending are left out)."""
    events = []
    for start in range(0, len(approval_ids), 500):
        qs = Approval.objects.filter(approval_id__in=approval_ids[start : start + 500])
        events.extend(decision_events(qs.exclude(status=Status.PENDING).order_by()))
    return events


def _decided_since(when) -> list[tuple[str, str]]:
    """``(approval_id, status)`` of the rows decided at or after ``when``.

    A plain statement, as it runs up to once per commit: building the queryset
    cost more than the look itself. No ordering: the model's default
    (-created_at) would turn this indexed range into a sort of the whole table.
    """
    table, aid, status, decided_at = _names()
    sql = f"SELECT {aid}, {status} FROM {table} WHERE {decided_at} >= %s AND {status} <> %s"
    with connection.cursor() as cursor:
        cursor.execute(sql, [connection.ops.adapt_datetimefield_value(when), Status.PENDING])
        return cursor.fetchall()


def _decided_ids(chunk: list[str]) -> list[str]:
    table, aid, status, _ = _names()
    marks = ", ".join(["%s"] * len(chunk))
    sql = f"SELECT {aid} FROM {table} WHERE {aid} IN ({marks}) AND {status} <> %s"
    with connection.cursor() as cursor:
        cursor.execute(sql, [*chunk, Status.PENDING])
        return [row[0] for row in cursor.fetchall()]


def _names() -> tuple[str, str, str, str]:
    """The table and its ``approval_id``, ``status`` and ``decided_at`` columns, quoted."""
    quote = connection.ops.quote_name
    meta = Approval._meta
    columns = (
        quote(meta.get_field(name).column) for name in ("approval_id", "status", "decided_at")
    )
    return (quote(meta.db_table), *columns)


def decision_events(qs) -> list[dict]:
    """``tool_decision`` events for decided rows, with who decided, in one query."""
    name = F(f"decided_by__{get_user_model().USERNAME_FIELD}")
    rows = qs.annotate(decided_by_name=name).values(*rowread.DECISION_FIELDS, "decided_by_name")
    return [_decision(row) for row in rows]


def _decision(row: dict) -> dict:
    """``tool_decision`` of a row of :data:`rowread.DECISION_FIELDS` and ``decided_by_name``."""
    return events.tool_decision(
        row,
        row["status"],
        row["decided_via"],
        row["decided_by_name"],
        row["reason"],
        row["edited_arguments"],
    )


class DatabaseTail:
    """Rows created or decided since the last look, found by id and by decided_at."""

    def __init__(self) -> None:
        self.reset_created()
        self.reset_decided()

    def reset_created(self) -> None:
        self.last_pk: int | None = None
        self.holes: dict[int, float] = {}

    def reset_decided(self) -> None:
        self.decided_mark = None

    def poll_created(self) -> list[dict]:
        if self.last_pk is None:
            # Start a little in the past: a socket that subscribed and read its
            # snapshot just before this first look must not miss a row committed
            # in between (it drops what its snapshot already holds).
            # The latest row created before then, found through the created_at
            # index (a max over every older row would read them all).
            start = timezone.now() - _START_OVERLAP
            older = Approval.objects.filter(created_at__lt=start).order_by("-created_at")
            self.last_pk = older.values_list("pk", flat=True).first() or 0
        out: list[dict] = []
        fields = ["pk", "user_id", "status", *events.PENDING_FIELDS]
        owner = F(f"user__{get_user_model().USERNAME_FIELD}")
        # Two primary-key look-ups: an OR of the two makes SQLite scan the table.
        rows = []
        if self.holes:
            filled = Approval.objects.filter(pk__in=list(self.holes)).order_by()
            rows.extend(filled.annotate(owner=owner).values(*fields, "owner"))
        newer = Approval.objects.filter(pk__gt=self.last_pk).order_by("pk").annotate(owner=owner)
        rows.extend(newer.values(*fields, "owner")[:2000])
        now = time.monotonic()
        for row in rows:
            self.holes.pop(row["pk"], None)
            if row["pk"] > self.last_pk:
                # Ids are handed out before commit: a gap may still fill in.
                for missing in range(max(self.last_pk + 1, row["pk"] - _HOLES_MAX), row["pk"]):
                    self.holes[missing] = now
                self.last_pk = row["pk"]
            out.append(events.tool_start(row))
        self.holes = {pk: t for pk, t in self.holes.items() if now - t < _HOLE_SECONDS}
        return out

    def poll_decided(self, known: Callable[[str, str], bool], *, full: bool = True) -> list[dict]:
        """``tool_decision`` events for rows decided lately that ``known`` has not seen.

        ``decided_at`` is set before commit, so each look reaches back before
        the last one: ``_DECIDED_OVERLAP`` for a ``full`` look, ``_QUICK_OVERLAP``
        for a quick one. A first light query finds what is new, and only that is
        read in full.
        """
        mark = timezone.now()
        if self.decided_mark is None:
            self.decided_mark = mark - _START_OVERLAP
            full = True
        overlap = _DECIDED_OVERLAP if full else _QUICK_OVERLAP
        new = [
            aid
            for aid, status in _decided_since(self.decided_mark - overlap)
            if not known(aid, status)
        ]
        self.decided_mark = mark
        return _read_decided(new)


def start_event(approval_id: str) -> dict | None:
    """``tool_start`` for one row, read by its approval id (``None`` if there is none)."""
    row = rowread.STARTS.read(approval_id)
    return events.tool_start(row) if row is not None else None


def decision_event(approval_id: str) -> dict | None:
    """``tool_decision`` for one decided row, read by its approval id (``None``: not decided)."""
    row = rowread.DECISIONS.read(approval_id)
    return _decision(row) if row is not None else None
