"""Reaching the approver: signed webhooks, the outbox and its worker, email, reminders.

Every webhook goes to a real receiver (tests/receiver.py) on 127.0.0.1.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from datetime import timedelta

import pytest
from django.core import mail
from django.db import connection, connections, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals import gate, hooks, listener, notify_worker, outbox
from approvals.decisions import decide
from approvals.models import Approval, Delivery, Reminder, Status, Via, Webhook
from approvals.notify_bodies import slack_body
from tests.receiver import Receiver

SITE = "https://toolgate.example.com"
SECRET = "s3cret-for-tests"


def settings_with(**extra):
    base = {"SITE_URL": SITE, "WEBHOOK_TIMEOUT": 2.0}
    return override_settings(APPROVALS={**base, **extra})


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def quiet(transactional_db):
    """No listener (and so no outbox worker) of this process's own, before and after."""
    listener.shutdown()
    outbox.forget_webhooks()
    yield
    listener.shutdown()


@pytest.fixture
def worker(quiet):
    w = notify_worker.Worker("test-worker").start()
    notify_worker._worker = w
    yield w
    w.stop()
    notify_worker._worker = None


def _hook(receiver, **fields) -> Webhook:
    fields.setdefault("events", ["approval.requested", "approval.decided", "approval.expiring"])
    return Webhook.objects.create(url=receiver.url, secret=SECRET, **fields)


def _gate(user=None, session="run-1", timeout=None, **details):
    aid = gate.new_approval_id()
    gate.begin_tool_decision(
        session, aid, tool_name="run_shell", arguments={"cmd": "ls"}, user=user, timeout=timeout
    )
    return aid


def _settled(n: int = 1, status: str = "delivered", timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while Delivery.objects.filter(status=status, claimed_until=None).count() < n:
        assert time.monotonic() < deadline, list(Delivery.objects.values("status", "attempts"))
        time.sleep(0.05)


def _verify(request) -> None:
    expected = hmac.new(SECRET.encode(), request.body, hashlib.sha256).hexdigest()
    assert request.headers["x-toolgate-signature"] == f"sha256={expected}"


def test_a_gated_call_posts_a_signed_requested_event(worker, receiver, django_user_model):
    user = django_user_model.objects.create_user("ann", "ann@example.com")
    _hook(receiver)
    with settings_with():
        aid = _gate(user)
        (request,) = receiver.wait_for(1)
    _verify(request)
    body = request.json()
    assert request.headers["x-toolgate-event"] == body["event"] == "approval.requested"
    assert request.headers["x-toolgate-delivery"] == body["delivery"]
    assert body["approval"]["approval_id"] == aid
    assert body["approval"]["status"] == "pending" and body["approval"]["decision"] is None
    assert set(body["approval"]) == {
        "approval_id", "session_id", "tool_name", "tool_call_id", "arguments",
        "edited_arguments", "description", "editable", "status", "decision",
        "decided_via", "reason", "message", "created_at", "expires_at",
        "decided_at", "executed_at",
    }  # fmt: skip
    assert body["links"] == {"review": f"{SITE}/approvals/{aid}/", "inbox": f"{SITE}/approvals/"}
    _settled()
    row = Delivery.objects.get(delivery_id=body["delivery"])
    assert row.status == "delivered" and row.attempts == 1 and row.body.encode() == request.body


def test_decided_event_and_user_filter(worker, receiver, django_user_model):
    ann = django_user_model.objects.create_user("ann")
    bob = django_user_model.objects.create_user("bob")
    _hook(receiver, user=ann, events=["approval.decided"])
    with settings_with():
        mine = _gate(ann)
        _gate(bob)  # not ann's: nothing for this webhook
        assert decide(mine, Status.DENIED, via=Via.WEB, by=ann, reason="no").won
        (request,) = receiver.wait_for(1)
        time.sleep(0.5)
    body = request.json()
    assert body["event"] == "approval.decided"
    assert body["approval"]["decision"] == "deny"
    assert body["approval"]["message"].endswith("Reason: no")
    assert len(receiver.requests) == 1


def test_a_rolled_back_change_writes_no_delivery(quiet, receiver):
    _hook(receiver)
    with pytest.raises(RuntimeError), transaction.atomic():
        a = Approval.objects.create(approval_id="rb", expires_at=timezone.now() + timedelta(1))
        hooks.gated(a)
        assert Delivery.objects.count() == 1
        raise RuntimeError
    assert Delivery.objects.count() == 0


def test_503_is_retried_with_the_same_delivery_id(worker, receiver):
    _hook(receiver)
    receiver.fail_next(3, 503)
    with settings_with():
        _gate()
        receiver.wait_for(1, timeout=20)
    ids = {r.headers["x-toolgate-delivery"] for r in receiver.requests}
    assert [r.status for r in receiver.requests] == [503, 503, 503, 200]
    assert len(ids) == 1
    gaps = [b.at - a.at for a, b in zip(receiver.requests, receiver.requests[1:], strict=False)]
    assert gaps[-1] > gaps[0]  # backing off
    _settled()
    row = Delivery.objects.get()
    assert row.status == "delivered" and row.attempts == 4 and row.last_status_code == 200


def test_a_delivery_past_its_window_is_given_up(worker, receiver):
    _hook(receiver)
    receiver.fail_next(100, 500)
    with settings_with(WEBHOOK_RETRY_FOR=1):
        _gate()
        deadline = time.monotonic() + 15
        while Delivery.objects.get().status != "failed" and time.monotonic() < deadline:
            time.sleep(0.2)
    row = Delivery.objects.get()
    assert row.status == "failed" and row.attempts >= 2 and row.last_error.startswith("HTTP 500")


def test_a_hanging_receiver_slows_neither_gating_nor_other_receivers(worker, receiver):
    slow = Receiver()
    slow.hang = 5.0
    try:
        _hook(receiver)
        Webhook.objects.create(url=slow.url, secret=SECRET, events=["approval.requested"])
        with settings_with(WEBHOOK_TIMEOUT=10.0):
            _gate()  # warm up
            receiver.wait_for(1)
            times = []
            for _ in range(10):
                started = time.monotonic()
                _gate()
                times.append(time.monotonic() - started)
            received = receiver.wait_for(11, timeout=4)
    finally:
        slow.close()
    assert max(times) < 0.5, times
    assert len(received) == 11  # while the slow receiver still holds its first request


def test_the_slack_body_has_the_review_link_as_a_button(worker, receiver):
    _hook(receiver, format="slack")
    with settings_with():
        aid = _gate()
        (request,) = receiver.wait_for(1)
    _verify(request)
    body = request.json()
    link = f"{SITE}/approvals/{aid}/"
    assert link in body["text"]
    buttons = [e for b in body["blocks"] if b["type"] == "actions" for e in b["elements"]]
    assert buttons[0]["url"] == link and buttons[0]["type"] == "button"


def test_the_email_contains_the_review_link(worker, django_user_model):
    user = django_user_model.objects.create_user("ann", "ann@example.com")
    with settings_with(EMAIL_NOTIFICATIONS=True):
        aid = _gate(user)
        deadline = time.monotonic() + 10
        while not mail.outbox and time.monotonic() < deadline:
            time.sleep(0.05)
    (message,) = mail.outbox
    assert message.to == ["ann@example.com"]
    assert f"{SITE}/approvals/{aid}/" in message.body
    assert "run_shell" in message.subject
    _settled()
    assert Delivery.objects.get().status == "delivered"


def test_expiring_fires_once_across_racing_reminders(worker, receiver, django_user_model):
    user = django_user_model.objects.create_user("ann", "ann@example.com")
    _hook(receiver, events=["approval.expiring"])
    with settings_with(EXPIRING_AFTER=0.5, EMAIL_NOTIFICATIONS=True):
        aid = _gate(user, timeout=2)
        assert outbox.remind() == 0  # not yet
        time.sleep(1.1)
        results = []
        threads = [
            threading.Thread(target=lambda: results.append(outbox.remind())) for _ in range(4)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sum(results) == 1
        assert outbox.remind() == 0
        (request,) = receiver.wait_for(1)
        time.sleep(0.5)
    assert request.json()["event"] == "approval.expiring"
    assert request.json()["approval"]["approval_id"] == aid
    assert len(receiver.requests) == 1
    assert Reminder.objects.count() == 1
    requested, expiring = mail.outbox  # one when gated, one reminder
    assert "still waiting" in expiring.subject and f"/approvals/{aid}/" in expiring.body


def test_claims_race_but_each_delivery_is_sent_once(quiet, receiver):
    hook = _hook(receiver)
    approval = Approval.objects.create(approval_id="race", expires_at="2100-01-01T00:00:00Z")
    Delivery.objects.bulk_create(
        Delivery(webhook=hook, event="approval.requested", approval=approval, body="{}")
        for _ in range(60)
    )
    workers = [notify_worker.Worker(f"w{i}") for i in range(4)]
    for w in workers:
        w.start().wake()
    try:
        receiver.wait_for(60, timeout=30)
        _settled(60)
    finally:
        for w in workers:
            w.stop()
    ids = [r.headers["x-toolgate-delivery"] for r in receiver.requests]
    assert len(ids) == len(set(ids)) == 60
    assert set(Delivery.objects.values_list("status", flat=True)) == {"delivered"}


def test_a_crashed_claimers_lease_runs_out(quiet, receiver):
    hook = _hook(receiver)
    row = Delivery.objects.create(webhook=hook, event="ping", body="{}")
    with settings_with():
        token, rows = notify_worker.claim("crashed", 10)
        assert [r.pk for r in rows] == [row.pk]
        assert notify_worker.claim("other", 10) == ("", [])  # leased
        Delivery.objects.filter(pk=row.pk).update(claimed_until="2000-01-01T00:00:00Z")
        token, rows = notify_worker.claim("other", 10)
        notify_worker.send_one(rows[0], token)
    assert receiver.wait_for(1)[0].headers["x-toolgate-delivery"] == str(row.delivery_id)


def _elsewhere(write):
    """Run ``write()`` on another thread's connection, as another process would."""
    done: list = []

    def run() -> None:
        try:
            done.append(write())
        finally:
            connections.close_all()

    writer = threading.Thread(target=run)
    writer.start()
    writer.join()
    return done[0]


def test_an_idle_worker_reads_the_outbox_only_when_something_may_be_due(quiet, receiver):
    """On an SQLite file a look that claimed nothing is not repeated, not even as a
    query, until another connection commits, the earliest pending delivery falls
    due, or ``wake()``; a delivery is sent all the same. On PostgreSQL every look reads."""
    hook = _elsewhere(lambda: _hook(receiver))
    w = notify_worker.Worker("idle-test")  # not started: each look runs here
    sqlite = connection.vendor == "sqlite"

    def look() -> tuple[int, int]:
        with CaptureQueriesContext(connection) as seen:
            claimed = w.pump()
        return claimed, len(seen.captured_queries)

    try:
        with settings_with():
            assert look()[1] > 0
            assert look() == (0, 0 if sqlite else 1)
            due = timezone.now() + timedelta(seconds=0.6)
            _elsewhere(
                lambda: Delivery.objects.create(
                    webhook=hook, event="ping", body="{}", next_attempt_at=due
                )
            )
            claimed, queries = look()  # a commit came: read, but nothing is due yet
            assert claimed == 0 and queries > 0
            assert look() == (0, 0 if sqlite else 1)
            while timezone.now() < due:
                time.sleep(0.05)
            assert look()[0] == 1  # due now: claimed without any commit or wake
            assert receiver.wait_for(1)[0].headers["x-toolgate-event"] == "ping"
            _settled(1)
            w._wake.clear()
            w.pump()  # reads what the sender recorded
            assert look() == (0, 0 if sqlite else 1)
            w.wake()
            assert look()[1] > 0
    finally:
        w._pool.shutdown(wait=True)


def test_send_test_and_retry_in_the_admin(quiet, receiver, admin_client):
    hook = _hook(receiver)
    receiver.fail_next(1, 500)
    w = notify_worker.Worker("admin-test").start()
    try:
        response = admin_client.post(
            "/admin/approvals/webhook/",
            {"action": "send_test", "_selected_action": [hook.pk]},
            follow=True,
        )
        assert "Queued 1 test" in response.content.decode()
        deadline = time.monotonic() + 10
        while not Delivery.objects.filter(attempts__gte=1, claimed_until=None).exists():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        Delivery.objects.update(next_attempt_at="2100-01-01T00:00:00Z")  # far off: retry skips it
        page = admin_client.get("/admin/approvals/delivery/").content.decode()
        assert "HTTP 500" in page
        row = Delivery.objects.get()
        admin_client.post(
            "/admin/approvals/delivery/", {"action": "retry", "_selected_action": [row.pk]}
        )
        w.wake()
        (request,) = receiver.wait_for(1)
    finally:
        w.stop()
    assert request.json()["event"] == "ping"
    _verify(request)
    form = admin_client.get(f"/admin/approvals/webhook/{hook.pk}/change/").content.decode()
    assert SECRET not in form


def test_slack_body_escapes_and_links():
    a = Approval(
        approval_id="x1",
        session_id="<s>",
        tool_name="t",
        arguments={"a": "<b>"},
        expires_at="2100-01-01T00:00:00Z",
    )
    with settings_with():
        body = json.loads(slack_body("approval.requested", "d", a))
    assert "&lt;s&gt;" in body["blocks"][0]["text"]["text"]
    assert body["text"].endswith(f"{SITE}/approvals/x1/")
