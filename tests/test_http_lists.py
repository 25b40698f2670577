"""The pending list and the rules endpoints: ownership, order, limits, revoking."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.test import Client, override_settings
from django.urls import reverse
from django.utils import timezone

from approvals.models import Rule
from tests.test_http import PENDING, RULES, grant_decide, make_approval


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


# -- the pending list ----------------------------------------------------------


@pytest.mark.django_db
def test_pending_list_shows_only_own_pending_unexpired_calls_oldest_first(as_alice, alice, bob):
    now = timezone.now()
    newer = make_approval(alice, created_at=now - timedelta(minutes=1), arguments={"n": 2})
    older = make_approval(alice, created_at=now - timedelta(minutes=5), session="s2")
    make_approval(bob)  # someone else's
    make_approval(alice, status="allowed")  # decided
    make_approval(alice, expires_at=now - timedelta(seconds=1))  # expired, not yet swept
    r = as_alice.get(PENDING)
    assert r.status_code == 200
    items = r.json()["pending"]
    assert [i["approval_id"] for i in items] == [older.approval_id, newer.approval_id]
    assert items[1] == {
        "approval_id": newer.approval_id,
        "session_id": "s1",
        "tool_name": "shell",
        "tool_call_id": "",
        "arguments": {"n": 2},
        "created_at": newer.created_at.isoformat(),
        "expires_at": newer.expires_at.isoformat(),
        "description": "",
        "editable": False,
        "user": "alice",
    }
    only_s2 = as_alice.get(PENDING, {"session_id": "s2"}).json()["pending"]
    assert [i["approval_id"] for i in only_s2] == [older.approval_id]


@pytest.mark.django_db
def test_a_decider_sees_everyones_pending_calls(alice, bob):
    make_approval(alice)
    make_approval(bob)
    client = Client()
    client.force_login(grant_decide(bob))
    assert len(client.get(PENDING).json()["pending"]) == 2


@pytest.mark.django_db
def test_pending_list_is_limited(as_alice, alice):
    for _ in range(3):
        make_approval(alice)
    with override_settings(APPROVALS={**settings.APPROVALS, "PENDING_LIMIT": 2}):
        assert len(as_alice.get(PENDING).json()["pending"]) == 2


@pytest.mark.django_db
def test_pending_list_errors(as_alice):
    r = Client().get(PENDING)
    assert r.status_code == 401 and r.json()["error"] == "authentication_required"
    r = as_alice.post(PENDING)
    assert r.status_code == 405 and r["Allow"] == "GET"
    r = as_alice.get(PENDING, {"session_id": "s" * 300})
    assert r.status_code == 400 and r.json()["error"] == "invalid_field"


# -- rules -----------------------------------------------------------------------


@pytest.mark.django_db
def test_rules_lists_own_unexpired_rules(as_alice, alice, bob):
    now = timezone.now()
    mine = Rule.objects.create(
        user=alice, tool_name="read_*", decision="allow", arguments_match={"path": "/tmp/*"}
    )
    Rule.objects.create(user=alice, tool_name="x", decision="deny", expires_at=now)
    Rule.objects.create(user=bob, tool_name="y", decision="allow")
    Rule.objects.create(user=None, tool_name="z", decision="deny")
    r = as_alice.get(RULES)
    assert r.status_code == 200
    assert r.json() == {
        "rules": [
            {
                "id": mine.pk,
                "session_id": "",
                "tool_name": "read_*",
                "arguments_match": {"path": "/tmp/*"},
                "decision": "allow",
                "created_at": mine.created_at.isoformat(),
                "expires_at": None,
                "note": "",
            }
        ]
    }
    assert Client().get(RULES).status_code == 401


@pytest.mark.django_db
def test_revoke_own_rule_only(alice, bob):
    mine = Rule.objects.create(user=alice, tool_name="a", decision="allow")
    theirs = Rule.objects.create(user=bob, tool_name="b", decision="allow")
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    url = reverse("approvals:rule-revoke", args=[mine.pk])
    r = client.post(url)
    assert r.status_code == 403 and r.json() == {
        "revoked": False,
        "error": "csrf_failed",
        "detail": r.json()["detail"],
    }
    client.get(PENDING)
    token = {"HTTP_X_CSRFTOKEN": client.cookies["csrftoken"].value}
    r = client.post(reverse("approvals:rule-revoke", args=[theirs.pk]), **token)
    assert r.status_code == 404 and r.json()["error"] == "not_found"
    r = client.post(url, **token)
    assert r.status_code == 200 and r.json() == {"revoked": True, "id": mine.pk}
    assert list(Rule.objects.values_list("pk", flat=True)) == [theirs.pk]
    assert client.post(url, **token).status_code == 404
    assert client.get(url).status_code == 405
    assert Client().post(url).status_code == 401
