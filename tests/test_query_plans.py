"""Every periodic and per-page query of the tail is answered through an index.

The listener's tail runs these once per pass in every process, so a full scan
of the approvals table would cost in proportion to the table, not to new rows.
SQLite: ``EXPLAIN QUERY PLAN`` must not ``SCAN`` the table. PostgreSQL: with
sequential scans discouraged, no plan may still need one.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals import pages
from approvals.dbtail import DatabaseTail, decided_among
from approvals.models import Approval, Status

pytestmark = pytest.mark.django_db


def _rows(user, count=40):
    now = timezone.now()
    made = Approval.objects.bulk_create(
        Approval(
            approval_id=f"plan-{i}",
            session_id="s",
            user=user,
            tool_name="t",
            status=Status.PENDING if i % 2 else Status.ALLOWED,
            decided_at=None if i % 2 else now,
            expires_at=now,
        )
        for i in range(count)
    )
    return made


def _tail_queries(user) -> list[str]:
    tail = DatabaseTail()
    with CaptureQueriesContext(connection) as captured:
        tail.poll_created()
        tail.holes = {1: 0.0, 2: 0.0}
        tail.last_pk = 3
        tail.poll_created()
        tail.poll_decided(lambda aid, status: False)
        decided_among(["plan-0", "plan-2"])
        pages.recent_decisions(user)
    return [q["sql"] for q in captured.captured_queries if "approvals_approval" in q["sql"]]


def _plan(sql: str) -> str:
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("EXPLAIN QUERY PLAN " + sql)
            return "\n".join(str(row[-1]) for row in cursor.fetchall())
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN " + sql)
        return "\n".join(row[0] for row in cursor.fetchall())


def test_the_tail_and_the_history_never_scan_the_table(django_user_model):
    if connection.vendor not in ("sqlite", "postgresql"):
        pytest.skip("plans checked on SQLite and PostgreSQL")
    user = django_user_model.objects.create_user("plans")
    _rows(user)
    queries = _tail_queries(user)
    assert len(queries) >= 5
    for sql in queries:
        plan = _plan(sql)
        if connection.vendor == "sqlite":
            assert "SCAN approvals_approval" not in plan.replace(
                "SCAN approvals_approval USING", ""
            ), (
                sql,
                plan,
            )
        else:
            assert "Seq Scan on approvals_approval" not in plan, (sql, plan)
