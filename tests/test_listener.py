"""The process listener's re-check keeps running whatever a pass runs into."""

from __future__ import annotations

import sqlite3
import threading
import time
import uuid
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.db import connection, connections
from django.test import override_settings
from django.utils import timezone

from approvals import daemon, gate, listenhooks
from approvals import listener as listener_module
from approvals.listener import Listener, get_listener
from approvals.models import Approval, ProcessLease

pytestmark = pytest.mark.django_db(transaction=True)


@override_settings(APPROVALS={"RECHECK_INTERVAL": 0.05})
def test_recheck_survives_a_failing_pass_and_a_failing_cleanup(monkeypatch):
    aid = gate.new_approval_id()
    slot = gate.begin_tool_decision("l1", aid, tool_name="shell")
    listener = get_listener()
    real_recheck = Listener.recheck
    failures = []

    def flaky(self):
        if not failures:
            failures.append("database gone")
            raise RuntimeError("database gone")
        return real_recheck(self)

    def cleanup_fails():
        raise RuntimeError("Database access not allowed")

    monkeypatch.setattr(Listener, "recheck", flaky)
    monkeypatch.setattr(daemon, "close_old_connections", cleanup_fails)
    listener._kick.set()
    try:
        # First the failing pass (a pass already running when the patch went in
        # could otherwise find the decision below before any pass failed).
        deadline = time.monotonic() + 5
        while not failures and time.monotonic() < deadline:
            time.sleep(0.01)
        assert failures == ["database gone"]
        # Decided as another process would: the row changes, nothing is announced here.
        Approval.objects.filter(approval_id=aid).update(
            status="allowed", decided_via="api", decided_at=timezone.now()
        )
        assert slot.wait(5) == "allowed"
        assert failures == ["database gone"]
        assert gate.wait_tool_decision(slot, aid) == "allow"
    finally:
        listener.unregister(slot)


def test_only_tasks_that_judge_leases_renew_the_lease_first(monkeypatch):
    """A lease written to the database wakes every other process's SQLite watcher, so
    a periodic task (reminders, every 2 s) does not renew it; the sweep, which judges
    calls by their process's lease, still does, even when the row went missing."""
    # This process's own listener would run the patched tasks too, from its thread.
    listener_module.shutdown()
    ran = []
    tasks = {
        "quiet": listenhooks._Periodic(lambda: 0.01, lambda: ran.append("quiet")),
        "judge": listenhooks._Periodic(lambda: 0.01, lambda: ran.append("judge"), True),
    }
    monkeypatch.setattr(listener_module, "_periodic", tasks)
    listener = Listener()
    listener.ensure_lease()
    old = timezone.now() - timedelta(minutes=5)
    ProcessLease.objects.filter(key=listener.key).update(heartbeat_at=old)
    listener._last_heartbeat = time.monotonic()  # the heartbeat itself not due
    listener._last_run = {"quiet": 0.0}
    listener.recheck()
    assert ran == ["quiet"]
    assert ProcessLease.objects.get(key=listener.key).heartbeat_at == old
    listener._last_run = {"judge": 0.0}
    ProcessLease.objects.filter(key=listener.key).delete()
    listener.recheck()
    assert ran == ["quiet", "judge"]
    assert ProcessLease.objects.get(key=listener.key).heartbeat_at > old


def test_a_failed_pass_closes_its_connection_even_when_the_cleanup_check_fails(monkeypatch):
    # After a failed pass the listener closes its thread's connection. Checking the
    # connection first (close_old_connections) can itself fail, as it does when
    # database access is refused outright; the close must happen all the same, or
    # a transaction left open would keep SQLite's write lock past the pass.
    connection.ensure_connection()
    sqlite = connection.vendor == "sqlite"
    if sqlite:
        connection.cursor().execute("BEGIN IMMEDIATE")  # a pass stopped midway

    def refused(*args, **kwargs):
        raise RuntimeError("Database access not allowed")

    with monkeypatch.context() as patched:
        patched.setattr(type(connections["default"]), "ensure_connection", refused)
        daemon.drop_connection()
    assert connection.connection is None
    if sqlite:  # the write lock is free: another connection writes at once
        other = sqlite3.connect(connection.settings_dict["NAME"], timeout=0)
        try:
            other.execute("BEGIN IMMEDIATE")
            other.rollback()
        finally:
            other.close()


@pytest.mark.django_db(transaction=True)
def _commit_elsewhere() -> None:
    """A commit on another connection, as another process's would be."""

    def write() -> None:
        try:
            Group.objects.create(name=f"commit-{uuid.uuid4().hex}")
        finally:
            connections.close_all()

    writer = threading.Thread(target=write)
    writer.start()
    writer.join()


def _recording_looks(lis: Listener) -> list[bool]:
    """Each ``poll_decided`` of ``lis``'s passes, as its ``full`` flag."""
    looks: list[bool] = []
    real = lis._tail.poll_decided

    def recording(known, *, full=True):
        looks.append(full)
        return real(known, full=full)

    lis._tail.poll_decided = recording
    return looks


def test_kicked_passes_look_quickly_and_one_per_interval_looks_back_the_whole_overlap(settings):
    """The database watcher kicks a pass per commit; only one pass per
    RECHECK_INTERVAL reads the whole overlap (a busy process would otherwise read
    ten seconds of decisions on every commit)."""
    from approvals.waiting import Slot

    settings.APPROVALS = {"RECHECK_INTERVAL": 60}
    lis = Listener()  # not started: passes run here, one at a time
    lis.register(Slot("waiting-id"))
    looks = _recording_looks(lis)
    for _ in range(5):
        _commit_elsewhere()  # what the watcher kicks a pass for
        lis.recheck()
    lis._last_full_tail -= 61  # as if RECHECK_INTERVAL had passed since the last full look
    _commit_elsewhere()
    lis.recheck()
    _commit_elsewhere()
    lis.recheck()
    assert looks == [True, False, False, False, False, True, False]


def test_a_pass_reads_only_what_may_have_changed(settings):
    """On an SQLite file a pass reads nothing while nobody committed and no waiter
    came (``PRAGMA data_version``): it would find what the last read found. A
    commit kicks a quick look, and the next full look still comes, since a quick
    one does not reach back far enough for a commit that came late. Elsewhere
    (PostgreSQL) every pass reads."""
    from approvals.waiting import Slot

    settings.APPROVALS = {"RECHECK_INTERVAL": 60}
    lis = Listener()
    lis.register(Slot("waiting-a"))
    looks = _recording_looks(lis)
    lis.recheck()
    lis.recheck()
    lis._last_full_tail -= 61
    lis.recheck()  # a full look is due, but nothing changed since the last one
    if connection.vendor != "sqlite":
        assert looks == [True, False, True]
        return
    assert looks == [True]
    _commit_elsewhere()
    lis.recheck()  # full: due since the pass before
    _commit_elsewhere()
    lis.recheck()
    lis.recheck()
    lis._last_full_tail -= 61
    lis.recheck()  # due, and a commit came after the last full look
    lis.recheck()
    lis.register(Slot("waiting-b"))
    lis.recheck()
    assert looks == [True, True, False, True, False]


def test_a_decision_made_on_a_quiet_database_still_wakes_its_waiter(settings):
    """The skipped reads lose nothing: a decision committed by another connection
    between two passes is read by the next one."""
    settings.APPROVALS = {"RECHECK_INTERVAL": 60}
    lis = Listener()
    aid = gate.new_approval_id()
    Approval.objects.create(approval_id=aid, expires_at=timezone.now() + timedelta(hours=1))
    from approvals.waiting import Slot

    slot = lis.register(Slot(aid))
    lis.recheck()
    lis.recheck()
    assert slot.status is None

    def decide_elsewhere() -> None:
        try:
            Approval.objects.filter(approval_id=aid).update(
                status="denied", decided_via="api", decided_at=timezone.now()
            )
        finally:
            connections.close_all()

    writer = threading.Thread(target=decide_elsewhere)
    writer.start()
    writer.join()
    lis.recheck()
    assert slot.wait(0) == "denied"
