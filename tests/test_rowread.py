"""One row by its approval id, in one statement built once: the same row, and the same
events, as the queryset API gives (on SQLite and PostgreSQL alike)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db.models import F
from django.utils import timezone

from approvals import events, rowread
from approvals.agentkeys import create_key
from approvals.dbtail import decided_among, decision_event, decision_events, start_event
from approvals.models import Approval, Status, Via

pytestmark = pytest.mark.django_db(transaction=True)

SCHEMA = {"type": "object", "properties": {"cmd": {"type": "string"}}}


def _username(path: str) -> F:
    return F(f"{path}__{get_user_model().USERNAME_FIELD}")


def _orm_start(aid: str) -> dict:
    """What the read did before: the queryset API."""
    qs = Approval.objects.filter(approval_id=aid).annotate(owner=_username("user"))
    return qs.values(*rowread.START_FIELDS, "owner").get()


@pytest.fixture
def rows(django_user_model):
    alice = django_user_model.objects.create_user("alice")
    boss = django_user_model.objects.create_user("boss")
    key, _ = create_key(alice, "alice-bot")
    now = timezone.now()
    full = Approval.objects.create(
        approval_id="full",
        session_id="s1",
        user=alice,
        tool_name="shell",
        tool_call_id="call-1",
        arguments={"cmd": "ls -l", "n": [1, 2.5, None, True], "é": "✓"},
        arguments_schema=SCHEMA,
        description="List the files",
        editable=True,
        created_at=now.replace(microsecond=0),  # isoformat without microseconds
        expires_at=now + timedelta(hours=1),
        agent_key=key,
    )
    bare = Approval.objects.create(approval_id="bare", expires_at=now)
    decided = Approval.objects.create(
        approval_id="decided",
        session_id="s2",
        user=alice,
        tool_name="rm",
        arguments={"path": "/tmp/x"},
        status=Status.ALLOWED,
        decided_via=Via.WEBSOCKET,
        decided_by=boss,
        decided_at=now,
        reason="looks fine",
        edited_arguments={"path": "/tmp/y"},
        expires_at=now,
    )
    return full, bare, decided


def test_the_start_row_is_the_one_values_returns(rows):
    for aid in ("full", "bare", "decided"):
        assert rowread.STARTS.read(aid) == _orm_start(aid), aid
    row = rowread.STARTS.read("full")
    assert row["owner"] == "alice" and row["agent_key__name"] == "alice-bot"
    assert row["arguments_schema"] == SCHEMA and row["arguments"]["é"] == "✓"
    assert rowread.STARTS.read("bare")["owner"] is None


def test_the_start_event_is_unchanged(rows):
    for aid in ("full", "bare", "decided"):
        assert start_event(aid) == events.tool_start(_orm_start(aid)), aid
    event = start_event("full")
    assert event["user"] == "alice" and event["agent"] == "alice-bot"
    assert event["created_at"] == rows[0].created_at.isoformat()
    assert event["awaiting_confirmation"] is True and event["_user_id"] == rows[0].user_id
    assert start_event("decided")["awaiting_confirmation"] is False


def test_the_decision_event_is_unchanged(rows):
    expected = decision_events(Approval.objects.filter(approval_id="decided"))[0]
    assert decision_event("decided") == expected
    assert expected["decided_by"] == "boss" and expected["edited_arguments"] == {"path": "/tmp/y"}
    assert decision_event("full") is None  # pending: nothing decided yet


def test_one_statement_per_read_and_none_for_no_row(rows, django_assert_num_queries):
    with django_assert_num_queries(1):
        assert start_event("missing") is None
    with django_assert_num_queries(1):
        assert decision_event("missing") is None
    with django_assert_num_queries(1):
        assert start_event("full") is not None


def test_decided_among_many_waiting_ids_reads_only_the_decided(rows, django_assert_num_queries):
    """The listener's check of every waiting id: one light statement per 500 ids, and a
    full read only of those decided (here one, in the third chunk of 1,002 ids)."""
    waiting = [f"nobody-{i}" for i in range(1000)] + ["full", "decided"]
    with django_assert_num_queries(3 + 1):
        found = decided_among(waiting)
    assert found == decision_events(Approval.objects.filter(approval_id="decided"))
    with django_assert_num_queries(2):
        assert decided_among(waiting[:1000]) == []
    assert decided_among([]) == []


# -- the tail's quick and full looks -------------------------------------------------


def _decided(aid: str, when) -> None:
    Approval.objects.create(
        approval_id=aid,
        session_id="tail",
        tool_name="t",
        status=Status.ALLOWED,
        decided_via=Via.API,
        decided_at=when,
        expires_at=when + timedelta(hours=1),
    )


def test_a_quick_look_reaches_back_a_moment_and_a_full_look_the_whole_overlap():
    """A decision committed long after its ``decided_at`` (a long wait for the write
    lock) is left to the full look; the quick looks a watcher asks for, up to one per
    commit, read only the rows decided since just before the last look."""
    from approvals import dbtail

    tail = dbtail.DatabaseTail()
    seen: list[str] = []

    def known(aid, status):
        return aid in seen

    def look(full):
        found = [event["approval_id"] for event in tail.poll_decided(known, full=full)]
        seen.extend(found)
        return found

    assert look(full=True) == []  # the first look (full whatever is asked)
    now = timezone.now()
    _decided("late-commit", now - timedelta(seconds=2))  # decided 2 s ago, visible only now
    _decided("fresh", now)
    assert look(full=False) == ["fresh"]
    assert look(full=True) == ["late-commit"]
    assert look(full=True) == []  # each once
    assert dbtail._QUICK_OVERLAP < timedelta(seconds=1) < dbtail._DECIDED_OVERLAP


def test_a_quick_look_reads_only_its_moment(monkeypatch):
    """What a quick look costs follows the decisions of its moment, not of ten seconds."""
    from approvals import dbtail

    tail = dbtail.DatabaseTail()
    tail.poll_decided(lambda aid, status: False)
    now = timezone.now()
    for i in range(30):
        _decided(f"older-{i}", now - timedelta(seconds=5))
    read: list[int] = []
    real = dbtail._decided_since
    monkeypatch.setattr(dbtail, "_decided_since", lambda when: read.append(len(real(when))) or [])
    for full in (False, True):
        tail.decided_mark = now
        tail.poll_decided(lambda aid, status: True, full=full)
    assert read == [0, 30]  # quick, then full
