"""A database notification's payload delivers by itself: a local waiter wakes with no
query, local sockets get the row read once, and nothing is delivered twice."""

from __future__ import annotations

import pytest
from django.db import connection
from django.utils import timezone

from approvals import pgnotify
from approvals.listener import Listener
from approvals.models import Approval, Status
from approvals.waiting import Slot

pytestmark = pytest.mark.django_db(transaction=True)


def _row(aid: str, status: str = Status.PENDING) -> Approval:
    now = timezone.now()
    return Approval.objects.create(
        approval_id=aid,
        session_id="s",
        tool_name="rm",
        status=status,
        created_at=now,
        expires_at=now,
        decided_at=None if status == Status.PENDING else now,
    )


def test_parse():
    assert pgnotify.parse("abc:allowed") == ("abc", "allowed")
    assert pgnotify.parse("a:b:denied") == ("a:b", "denied")
    assert pgnotify.parse("abc") == ("abc", "")


def test_a_decision_wakes_a_local_waiter_without_a_query(django_assert_num_queries):
    listener = Listener()
    slot = listener.register(Slot("w1"))
    with django_assert_num_queries(0):
        pgnotify.handle(listener, "w1:allowed")
        pgnotify.handle(listener, "elsewhere:denied")  # not ours, no sockets: ignored
        pgnotify.handle(listener, "w2:pending")
    assert slot.status == "allowed"


def test_sockets_get_each_event_once_from_one_read(django_assert_num_queries):
    _row("s1")
    listener = Listener()
    slot = listener.register(Slot("s1"))
    got: list[dict] = []
    listener.subscribe(got.append)
    with django_assert_num_queries(1):
        pgnotify.handle(listener, "s1:pending")
    decided = {"status": Status.DENIED, "decided_at": timezone.now()}
    Approval.objects.filter(approval_id="s1").update(**decided)
    with django_assert_num_queries(1):
        pgnotify.handle(listener, "s1:denied")
    pgnotify.handle(listener, "s1:denied")  # a repeat (or the tail later) is not delivered
    assert [(e["type"], e.get("status")) for e in got] == [
        ("tool_start", None),
        ("tool_decision", "denied"),
    ]
    assert got[0]["tool_name"] == "rm"
    assert slot.status == "denied"


def test_a_payload_without_a_status_reads_the_row():
    _row("old", Status.ALLOWED)
    listener = Listener()
    slot = listener.register(Slot("old"))
    pgnotify.handle(listener, "old")
    assert slot.status == "allowed"


def test_reads_keep_their_connection(django_assert_num_queries):
    """The watcher thread's reads reuse one connection: no reconnect, no extra round trip."""
    _row("k1")
    _row("k2")
    listener = Listener()
    got: list[dict] = []
    listener.subscribe(got.append)
    pgnotify.handle(listener, "k1:pending")
    kept = connection.connection
    assert kept is not None  # left open after the read
    with django_assert_num_queries(1):
        pgnotify.handle(listener, "k2:pending")
    assert connection.connection is kept
    assert [e["approval_id"] for e in got] == ["k1", "k2"]
