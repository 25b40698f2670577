"""The Approval changelist at scale: constant queries, filters, search, the date hierarchy."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals.admin.dates import date_hierarchy
from approvals.admin.filters import format_duration
from approvals.models import Approval
from tests.test_admin import CHANGELIST, make_approval, staff


@pytest.fixture
def decider(django_user_model):
    return staff(django_user_model, "dora", "view_approval", "decide_approval")


# -- the changelist ----------------------------------------------------------------------


def _changelist_queries(client, query="") -> int:
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(CHANGELIST + query).status_code == 200
    # No scan of the whole table for filter choices or the date hierarchy.
    assert not [q["sql"] for q in ctx.captured_queries if "DISTINCT" in q["sql"].upper()]
    return len(ctx.captured_queries)


@pytest.mark.django_db
def test_changelist_query_count_is_constant(decider, django_user_model):
    _, client = decider
    users = [django_user_model.objects.create_user(f"u{i}") for i in range(5)]
    for i in range(5):
        make_approval(users[i], status="allowed", decided_by=users[-i], decided_at=timezone.now())
    _changelist_queries(client)  # from the second request on, the session brings its user
    few = _changelist_queries(client)
    rows = [
        Approval(
            approval_id=f"id-{i}",
            session_id=f"s{i % 7}",
            user=users[i % 5],
            tool_name=f"tool{i % 4}",
            status="allowed" if i % 2 else "pending",
            decided_by=users[i % 3] if i % 2 else None,
            decided_via="web" if i % 2 else "",
            decided_at=timezone.now() if i % 2 else None,
            expires_at=timezone.now() + timedelta(hours=1),
        )
        for i in range(300)
    ]
    Approval.objects.bulk_create(rows)
    many = _changelist_queries(client)
    assert many == few
    # Session with its user, permissions, tool names, count, page, and the date hierarchy.
    assert many <= 10, many
    assert _changelist_queries(client, "?awaiting=yes") <= 10
    assert _changelist_queries(client, "?q=id-7") <= 11


@pytest.mark.django_db
def test_changelist_query_count_with_date_probes(decider, monkeypatch):
    import approvals.admin.dates

    monkeypatch.setattr(approvals.admin.dates, "SMALL_LIST", 0)  # as with a long list
    _, client = decider
    make_approval()
    # The date hierarchy's index probes: one per day of this month (every row is from
    # today), or per month of a chosen year.
    assert _changelist_queries(client) <= 8 + 31 + 2
    assert _changelist_queries(client, f"?created_at__year={timezone.now().year}") <= 8 + 12


@pytest.mark.django_db
def test_filters_and_search(decider):
    _, client = decider
    waiting = make_approval(session="alpha", tool="git")
    make_approval(expires_at=timezone.now() - timedelta(seconds=1))  # past its deadline
    make_approval(status="allowed", decided_via="rule", tool="git")
    listed = client.get(CHANGELIST, {"awaiting": "yes"}).context["cl"].result_list
    assert [a.pk for a in listed] == [waiting.pk]
    found = client.get(CHANGELIST, {"q": waiting.approval_id}).context["cl"].result_list
    assert [a.pk for a in found] == [waiting.pk]
    found = client.get(CHANGELIST, {"q": waiting.approval_id[:10]}).context["cl"].result_list
    assert [a.pk for a in found] == [waiting.pk]
    by_session = client.get(CHANGELIST, {"session_id": "alpha"}).context["cl"].result_list
    assert [a.pk for a in by_session] == [waiting.pk]
    git = client.get(CHANGELIST, {"tool_name": "git", "status__exact": "allowed"})
    assert [a.tool_name for a in git.context["cl"].result_list] == ["git"]
    tool_filter = next(f for f in git.context["cl"].filter_specs if f.title == "tool")
    assert list(tool_filter.lookup_choices) == ["git", "shell"]
    r = client.get(CHANGELIST, {"decided_via__exact": "rule"})
    assert len(r.context["cl"].result_list) == 1
    html = client.get(CHANGELIST).content.decode()
    for column in ("Created", "User", "Session", "Tool", "Status", "Decided via", "Decided by"):
        assert f">{column}<" in html or f">{column}</a>" in html, column
    assert "Time to decision" in html


def test_format_duration():
    assert format_duration(None) == "—"
    assert format_duration(timedelta(seconds=0.42)) == "0.4 s"
    assert format_duration(timedelta(seconds=42)) == "42 s"
    assert format_duration(timedelta(seconds=184)) == "3 min 4 s"
    assert format_duration(timedelta(hours=2, minutes=5)) == "2 h 5 min"
    assert format_duration(timedelta(days=3, hours=4)) == "3 d 4 h"


@pytest.mark.django_db
@pytest.mark.parametrize(
    "spread",
    [
        [timedelta(0)],  # one day: days of that month
        [timedelta(0), timedelta(days=1)],
        [timedelta(0), timedelta(days=40)],  # one year: its months
        [timedelta(0), timedelta(days=400), timedelta(days=800)],  # years
    ],
)
@pytest.mark.parametrize("small_list", [1000, 0], ids=["read-dates", "index-probes"])
def test_date_hierarchy_matches_djangos_own(decider, spread, small_list, monkeypatch):
    from django.contrib.admin.templatetags.admin_list import date_hierarchy as djangos

    import approvals.admin.dates

    monkeypatch.setattr(approvals.admin.dates, "SMALL_LIST", small_list)
    _, client = decider
    base = timezone.now().replace(month=1, day=10, hour=12) - timedelta(days=900)
    for delta in spread:
        make_approval(created_at=base + delta, status="allowed", decided_via="api")
    queries = ["", "?awaiting=no"]
    cl = client.get(CHANGELIST).context["cl"]
    year = str(base.year)
    queries += [f"?created_at__year={year}", f"?created_at__year={year}&created_at__month=1"]
    queries += [f"?created_at__year={year}&created_at__month=1&created_at__day=10"]
    for query in queries:
        response = client.get(CHANGELIST + query)
        cl = response.context["cl"]
        expected = djangos(cl)
        if "field_name" not in expected:  # Django < 6 does not name the field
            expected["field_name"] = "created"
        assert date_hierarchy(cl) == expected, query
        assert response.context["approvals_dates"] == expected, query
        assert "created_at__year" in response.content.decode()
