"""The JSON endpoints, row by row of the contract's HTTP table, through Django's test client."""

from __future__ import annotations

import asyncio
import io
import json
import threading
from datetime import timedelta

import pytest
from django.conf import settings
from django.contrib.auth.models import Permission
from django.core.handlers.asgi import ASGIRequest
from django.test import AsyncClient, Client
from django.urls import reverse
from django.utils import timezone

from approvals import gate, views
from approvals.errors import RequestError
from approvals.models import Approval, Rule

CONFIRM = "/api/inference/tool-confirm"
PENDING = "/api/inference/tool-approvals"
RULES = "/api/inference/rules"


def make_approval(user=None, session="s1", tool="shell", status="pending", **kw) -> Approval:
    now = timezone.now()
    kw.setdefault("created_at", now)
    kw.setdefault("expires_at", now + timedelta(hours=1))
    kw.setdefault("arguments", {"cmd": "ls -la"})
    return Approval.objects.create(
        approval_id=gate.new_approval_id(),
        session_id=session,
        user=user,
        tool_name=tool,
        status=status,
        **kw,
    )


def post(client, body, **extra):
    data = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return client.post(CONFIRM, data=data, content_type="application/json", **extra)


@pytest.fixture
def alice(django_user_model):
    return django_user_model.objects.create_user("alice")


@pytest.fixture
def bob(django_user_model):
    return django_user_model.objects.create_user("bob")


@pytest.fixture
def as_alice(alice):
    client = Client()
    client.force_login(alice)
    return client


def grant_decide(user):
    user.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    return type(user).objects.get(pk=user.pk)  # drop the permission cache


# -- 200 ---------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(("decision", "status"), [("allow", "allowed"), ("deny", "denied")])
def test_decided_by_this_request(as_alice, alice, decision, status):
    a = make_approval(alice)
    r = post(as_alice, {"approval_id": a.approval_id, "decision": decision, "reason": "ok by me"})
    assert r.status_code == 200
    assert r["Content-Type"] == "application/json"
    assert r.json() == {"resolved": True, "approval_id": a.approval_id, "status": status}
    a.refresh_from_db()
    assert (a.status, a.decided_via, a.decided_by, a.reason) == (status, "web", alice, "ok by me")
    assert a.decided_at is not None


@pytest.mark.django_db
def test_matching_session_id_is_accepted(as_alice, alice):
    a = make_approval(alice, session="chat-7")
    r = post(as_alice, {"approval_id": a.approval_id, "decision": "deny", "session_id": "chat-7"})
    assert r.status_code == 200 and r.json()["status"] == "denied"


@pytest.mark.django_db
@pytest.mark.parametrize("scope", ["session", "always"])
def test_remember_stores_a_rule_with_the_decision(as_alice, alice, scope):
    a = make_approval(alice, session="chat-1", tool="read_file")
    r = post(as_alice, {"approval_id": a.approval_id, "decision": "allow", "remember": scope})
    assert r.status_code == 200
    assert r.json()["remembered"] == scope
    rule = Rule.objects.get()
    assert (rule.user, rule.tool_name, rule.decision, rule.created_by) == (
        alice,
        "read_file",
        "allow",
        alice,
    )
    assert rule.session_id == ("chat-1" if scope == "session" else "")


@pytest.mark.django_db
def test_remember_session_on_a_call_without_a_session_is_refused_whole(as_alice, alice):
    a = make_approval(alice, session="")
    r = post(as_alice, {"approval_id": a.approval_id, "decision": "allow", "remember": "session"})
    assert r.status_code == 400
    assert r.json()["error"] == "invalid_field" and r.json()["resolved"] is False
    assert Approval.objects.get(pk=a.pk).status == "pending"  # the decision rolled back
    assert not Rule.objects.exists()


@pytest.mark.django_db
def test_a_decider_may_decide_someone_elses_call(alice, bob):
    bob = grant_decide(bob)
    a = make_approval(alice)
    client = Client()
    client.force_login(bob)
    r = post(client, {"approval_id": a.approval_id, "decision": "allow"})
    assert r.status_code == 200
    a.refresh_from_db()
    assert a.decided_by == bob


@pytest.mark.django_db(transaction=True)
def test_a_waiting_agent_wakes_with_the_http_answer(alice):
    aid = gate.new_approval_id()
    slot = gate.begin_tool_decision("s1", aid, tool_name="shell", user=alice)
    box = {}
    waiter = threading.Thread(target=lambda: box.update(answer=gate.wait_tool_decision(slot, aid)))
    waiter.start()
    client = Client()
    client.force_login(alice)
    r = post(client, {"approval_id": aid, "decision": "deny", "reason": "not on prod"})
    waiter.join(5)
    assert r.status_code == 200
    assert box["answer"] == "deny"
    assert gate.denial_message(aid).endswith("Reason: not on prod")


# -- 400 ---------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "code"),
    [
        ("{not json", "invalid_json"),
        ("[1, 2]", "invalid_json"),
        ('{"approval_id": "a", "approval_id": "b", "decision": "allow"}', "invalid_json"),
        (b"\xff\xfe", "invalid_json"),
        ("", "invalid_json"),
        ({"decision": "allow"}, "missing_field"),
        ({"approval_id": "x"}, "missing_field"),
        ({"approval_id": 12, "decision": "allow"}, "invalid_field"),
        ({"approval_id": "", "decision": "allow"}, "invalid_field"),
        ({"approval_id": "x", "decision": "allow", "reason": 5}, "invalid_field"),
        ({"approval_id": "x", "decision": "allow", "session_id": ["s"]}, "invalid_field"),
        ({"approval_id": "x", "decision": "allow", "remember": "forever"}, "invalid_field"),
        ({"approval_id": "x", "decision": "maybe"}, "invalid_decision"),
        ({"approval_id": "x", "decision": "ALLOW"}, "invalid_decision"),
        ({"approval_id": "x", "decision": 1}, "invalid_field"),
    ],
)
def test_bad_requests_get_400_with_a_code_and_a_sentence(as_alice, alice, body, code):
    a = make_approval(alice)
    r = post(as_alice, body)
    assert r.status_code == 400
    data = r.json()
    assert data["resolved"] is False
    assert data["error"] == code
    assert isinstance(data["detail"], str) and len(data["detail"]) > 10
    a.refresh_from_db()
    assert a.status == "pending"


@pytest.mark.django_db
def test_a_body_over_16_kib_is_too_large(as_alice, alice):
    a = make_approval(alice)
    body = {"approval_id": a.approval_id, "decision": "allow", "reason": "x" * 17000}
    r = post(as_alice, body)
    assert r.status_code == 400
    assert r.json()["error"] == "too_large"
    assert "16384" in r.json()["detail"]
    a.refresh_from_db()
    assert a.status == "pending"


@pytest.mark.django_db
def test_a_declared_length_over_the_limit_is_refused_before_reading(as_alice):
    r = as_alice.post(CONFIRM, data="{}", content_type="application/json", CONTENT_LENGTH="999999")
    assert r.status_code == 400
    assert r.json()["error"] == "too_large"


def test_the_actual_size_counts_when_no_length_is_declared():
    """Under ASGI a chunked body has no Content-Length: reading stops one byte past the limit."""
    scope = {"type": "http", "method": "POST", "path": CONFIRM, "headers": [], "query_string": b""}
    stream = io.BytesIO(b"x" * 100_000)
    with pytest.raises(RequestError) as err:
        views.read_body(ASGIRequest(scope, stream))
    assert err.value.code == "too_large"
    assert stream.tell() <= settings.APPROVALS.get("MAX_BODY_BYTES", 16384) + 1


# -- 401, 403 ------------------------------------------------------------------


@pytest.mark.django_db
def test_anonymous_gets_401_json_not_a_login_redirect(alice):
    a = make_approval(alice)
    r = post(Client(), {"approval_id": a.approval_id, "decision": "allow"})
    assert r.status_code == 401
    assert r.json()["resolved"] is False
    assert r.json()["error"] == "authentication_required"
    assert r.json()["detail"]
    assert Approval.objects.get(pk=a.pk).status == "pending"


@pytest.mark.django_db
def test_csrf_is_enforced_and_answered_in_json(alice):
    a = make_approval(alice)
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    r = post(client, {"approval_id": a.approval_id, "decision": "allow"})
    assert r.status_code == 403
    assert r["Content-Type"] == "application/json"
    assert r.json()["error"] == "csrf_failed"
    assert r.json()["resolved"] is False
    assert "X-CSRFToken" in r.json()["detail"]
    assert Approval.objects.get(pk=a.pk).status == "pending"

    # The pending list hands out the token; echoed in X-CSRFToken the POST passes.
    assert client.get(PENDING).status_code == 200
    token = client.cookies["csrftoken"].value
    r = post(client, {"approval_id": a.approval_id, "decision": "allow"}, HTTP_X_CSRFTOKEN=token)
    assert r.status_code == 200
    assert Approval.objects.get(pk=a.pk).status == "allowed"


@pytest.mark.django_db
def test_a_wrong_csrf_token_fails(alice):
    a = make_approval(alice)
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    client.get(PENDING)
    r = post(client, {"approval_id": a.approval_id, "decision": "allow"}, HTTP_X_CSRFTOKEN="x" * 32)
    assert r.status_code == 403 and r.json()["error"] == "csrf_failed"


# -- 404 -----------------------------------------------------------------------


@pytest.mark.django_db
def test_not_found_never_hints_that_a_call_exists(as_alice, alice, bob):
    theirs = make_approval(bob)
    mine = make_approval(alice, session="right")
    attempts = [
        {"approval_id": "no-such-id", "decision": "allow"},
        {"approval_id": theirs.approval_id, "decision": "allow"},
        {"approval_id": mine.approval_id, "decision": "allow", "session_id": "wrong"},
    ]
    bodies = []
    for body in attempts:
        r = post(as_alice, body)
        assert r.status_code == 404
        bodies.append(r.json())
    assert bodies[0] == bodies[1] == bodies[2]
    assert bodies[0]["error"] == "not_found" and bodies[0]["resolved"] is False
    assert set(Approval.objects.values_list("status", flat=True)) == {"pending"}


@pytest.mark.django_db
def test_another_users_decided_call_is_still_not_found(as_alice, bob):
    theirs = make_approval(bob, status="allowed", decided_via="api")
    r = post(as_alice, {"approval_id": theirs.approval_id, "decision": "deny"})
    assert r.status_code == 404


# -- 409 -----------------------------------------------------------------------


@pytest.mark.django_db
def test_a_second_decision_gets_409_with_the_final_status(as_alice, alice):
    a = make_approval(alice)
    assert post(as_alice, {"approval_id": a.approval_id, "decision": "deny"}).status_code == 200
    r = post(as_alice, {"approval_id": a.approval_id, "decision": "allow"})
    assert r.status_code == 409
    assert r.json()["resolved"] is False
    assert r.json()["error"] == "already_decided"
    assert r.json()["status"] == "denied"
    assert r.json()["detail"]
    assert Approval.objects.get(pk=a.pk).status == "denied"


@pytest.mark.django_db
def test_an_expired_call_gets_409_expired_and_is_recorded(as_alice, alice):
    past = timezone.now() - timedelta(seconds=5)
    a = make_approval(alice, created_at=past - timedelta(hours=1), expires_at=past)
    r = post(as_alice, {"approval_id": a.approval_id, "decision": "allow"})
    assert r.status_code == 409
    assert r.json()["status"] == "expired"
    a.refresh_from_db()
    assert (a.status, a.decided_via) == ("expired", "timeout")


# -- 405 -----------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("method", ["get", "put", "patch", "delete", "head", "options"])
def test_any_method_but_post_gets_405(as_alice, method):
    r = getattr(as_alice, method)(CONFIRM)
    assert r.status_code == 405
    assert r["Allow"] == "POST"
    if method != "head":
        assert r.json()["error"] == "method_not_allowed"


# -- mounting, ASGI, the document ------------------------------------------------


def test_url_names_are_namespaced():
    assert reverse("approvals:tool-confirm") == CONFIRM
    assert reverse("approvals:tool-approvals") == PENDING
    assert reverse("approvals:rules") == RULES
    assert reverse("approvals:openapi") == "/api/inference/openapi.json"


@pytest.mark.django_db
def test_openapi_document_is_served_with_its_mount_prefix():
    r = Client().get("/api/inference/openapi.json")
    assert r.status_code == 200
    doc = r.json()
    assert doc["openapi"].startswith("3.1")
    assert doc["servers"] == [{"url": "/api/inference"}]
    assert {"/tool-confirm", "/tool-approvals", "/rules", "/rules/{id}/revoke"} <= set(doc["paths"])


@pytest.mark.django_db(transaction=True)
def test_the_endpoints_answer_under_asgi(alice):
    a = make_approval(alice)
    body = {"approval_id": a.approval_id, "decision": "allow"}

    async def scenario():
        client = AsyncClient()
        anonymous = await client.post(CONFIRM, body, "application/json")
        await client.aforce_login(alice)
        listed = await client.get(PENDING)
        decided = await client.post(CONFIRM, body, "application/json")
        return anonymous, listed, decided

    anonymous, listed, decided = asyncio.run(scenario())
    assert anonymous.status_code == 401
    assert anonymous.json()["error"] == "authentication_required"
    assert [i["approval_id"] for i in listed.json()["pending"]] == [a.approval_id]
    assert decided.status_code == 200 and decided.json()["status"] == "allowed"
