"""The JSON endpoints as the host mounts them: ``/agent-gate/v1/``."""

from __future__ import annotations

import json
import threading

import pytest
from django.middleware.csrf import get_token
from django.test import Client, RequestFactory
from django.urls import reverse

from approvals import gate
from approvals.models import Approval

pytestmark = pytest.mark.django_db(transaction=True)

PREFIX = "/agent-gate/v1/"


def _csrf_client(user=None) -> tuple[Client, str]:
    """A client that enforces CSRF, with a csrftoken cookie and the matching header value."""
    client = Client(enforce_csrf_checks=True)
    if user is not None:
        client.force_login(user)
    request = RequestFactory().get("/")
    token = get_token(request)
    client.cookies["csrftoken"] = request.META["CSRF_COOKIE"]
    return client, token


def _post(client, token, body, **headers):
    return client.post(
        PREFIX + "tool-confirm",
        json.dumps(body),
        content_type="application/json",
        headers={"X-CSRFToken": token, **headers} if token else headers,
    )


def _gate(user, session="run-http", tool="shell"):
    aid = gate.new_approval_id()
    slot = gate.begin_tool_decision(session, aid, tool_name=tool, arguments={"n": 1}, user=user)
    return aid, slot


def test_the_endpoints_reverse_under_the_hosts_prefix():
    assert reverse("approvals:tool-confirm") == PREFIX + "tool-confirm"
    assert reverse("approvals:tool-approvals") == PREFIX + "tool-approvals"


def test_post_decides_and_wakes_the_waiter(alice):
    aid, slot = _gate(alice)
    box: dict = {}
    waiter = threading.Thread(target=lambda: box.update(a=gate.wait_tool_decision(slot, aid)))
    waiter.start()
    client, token = _csrf_client(alice)

    response = _post(client, token, {"approval_id": aid, "decision": "allow", "reason": "ok"})
    assert response.status_code == 200, response.content
    assert response.json() == {"resolved": True, "approval_id": aid, "status": "allowed"}
    waiter.join(5)
    assert box["a"] == "allow"
    row = Approval.objects.get(approval_id=aid)
    assert (row.decided_via, row.decided_by, row.reason) == ("web", alice, "ok")

    again = _post(client, token, {"approval_id": aid, "decision": "deny"})
    assert again.status_code == 409
    assert again.json()["error"] == "already_decided" and again.json()["status"] == "allowed"


def test_csrf_is_enforced(alice):
    aid, slot = _gate(alice)
    client, _token = _csrf_client(alice)
    response = _post(client, None, {"approval_id": aid, "decision": "allow"})
    assert response.status_code == 403
    assert Approval.objects.get(approval_id=aid).status == "pending"
    gate.abort_tool_decision(slot, aid)


def test_another_users_approval_is_not_found(alice, bob):
    aid, slot = _gate(alice)
    client, token = _csrf_client(bob)
    response = _post(client, token, {"approval_id": aid, "decision": "allow"})
    assert response.status_code == 404
    assert response.json()["error"] == "not_found"
    assert Approval.objects.get(approval_id=aid).status == "pending"
    gate.abort_tool_decision(slot, aid)


def test_anonymous_gets_json_401(alice):
    aid, slot = _gate(alice)
    client, token = _csrf_client()
    response = _post(client, token, {"approval_id": aid, "decision": "allow"})
    assert response.status_code == 401
    assert response.json()["error"] == "authentication_required"
    gate.abort_tool_decision(slot, aid)


def test_reviewer_with_the_permission_decides_anyones_call(alice, reviewer):
    aid, slot = _gate(alice)
    client, token = _csrf_client(reviewer)
    response = _post(client, token, {"approval_id": aid, "decision": "deny", "reason": "no"})
    assert response.status_code == 200
    assert gate.wait_tool_decision(slot, aid) == "deny"
    assert Approval.objects.get(approval_id=aid).decided_by == reviewer


def test_pending_list_shows_only_ones_own_calls(alice, bob):
    mine, s1 = _gate(alice, session="a-run")
    theirs, s2 = _gate(bob, session="b-run")
    client = Client()
    client.force_login(alice)
    response = client.get(PREFIX + "tool-approvals")
    assert response.status_code == 200
    assert [p["approval_id"] for p in response.json()["pending"]] == [mine]
    narrowed = client.get(PREFIX + "tool-approvals", {"session_id": "b-run"})
    assert narrowed.json()["pending"] == []
    gate.abort_tool_decision(s1, mine)
    gate.abort_tool_decision(s2, theirs)


def test_openapi_document_is_served_under_the_hosts_prefix(alice):
    client = Client()
    client.force_login(alice)
    response = client.get(PREFIX + "openapi.json")
    assert response.status_code == 200
    document = response.json()
    assert document["openapi"].startswith("3.1")
    assert document["servers"] == [{"url": PREFIX.rstrip("/")}]
    assert "/tool-confirm" in document["paths"]


def test_remembered_rule_is_listed_and_revoked_under_the_hosts_prefix(alice, bob):
    aid, slot = _gate(alice, session="rule-run", tool="read_file")
    client, token = _csrf_client(alice)
    body = {"approval_id": aid, "decision": "allow", "remember": "always"}
    assert _post(client, token, body).status_code == 200
    gate.wait_tool_decision(slot, aid)

    rules = client.get(PREFIX + "rules").json()["rules"]
    assert [(r["tool_name"], r["decision"]) for r in rules] == [("read_file", "allow")]
    revoke = PREFIX + f"rules/{rules[0]['id']}/revoke"
    other, other_token = _csrf_client(bob)
    assert other.post(revoke, headers={"X-CSRFToken": other_token}).status_code == 404
    response = client.post(revoke, headers={"X-CSRFToken": token})
    assert response.status_code == 200 and response.json()["revoked"] is True
    assert client.get(PREFIX + "rules").json()["rules"] == []
