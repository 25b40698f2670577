"""The admin as the host mounts it (``/backoffice/``), with UUID users."""

from __future__ import annotations

import threading

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.test import Client

from approvals import gate
from approvals.models import Approval

pytestmark = pytest.mark.django_db(transaction=True)

CHANGELIST = "/backoffice/approvals/approval/"


def _gate(user, tool="shell"):
    aid = gate.new_approval_id()
    slot = gate.begin_tool_decision("admin-run", aid, tool_name=tool, user=user)
    return aid, slot


def _client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_allow_selected_decides_and_wakes_the_waiter(alice, reviewer):
    aid, slot = _gate(alice)
    done, done_slot = _gate(alice, tool="email")
    assert gate.resolve_tool_decision(done, "deny")
    box: dict = {}
    waiter = threading.Thread(target=lambda: box.update(a=gate.wait_tool_decision(slot, aid)))
    waiter.start()
    pks = list(Approval.objects.filter(approval_id__in=[aid, done]).values_list("pk", flat=True))
    client = _client(reviewer)

    confirm = client.post(
        CHANGELIST, {"action": "allow_selected", ACTION_CHECKBOX_NAME: pks}, follow=False
    )
    assert confirm.status_code == 200
    page = confirm.content.decode()
    assert "alice@example.com" in page and 'name="post" value="yes"' in page
    assert Approval.objects.get(approval_id=aid).status == "pending"

    response = client.post(
        CHANGELIST,
        {"action": "allow_selected", ACTION_CHECKBOX_NAME: pks, "post": "yes", "reason": "ok"},
        follow=True,
    )
    assert response.status_code == 200
    assert "Decided 1, skipped 1" in response.content.decode()
    waiter.join(5)
    assert box["a"] == "allow"
    row = Approval.objects.get(approval_id=aid)
    assert (row.status, row.decided_via, row.decided_by, row.reason) == (
        "allowed",
        "admin",
        reviewer,
        "ok",
    )
    gate.wait_tool_decision(done_slot, done)


def test_the_actions_need_the_decide_permission(alice, make_user):
    viewer = make_user("auditor@example.com", perms=("approvals.view_approval",), staff=True)
    aid, slot = _gate(alice)
    response = _client(viewer).get(CHANGELIST)
    assert response.status_code == 200
    actions = dict(response.context["action_form"].fields["action"].choices)
    assert "allow_selected" not in actions and "deny_selected" not in actions
    pk = Approval.objects.get(approval_id=aid).pk
    _client(viewer).post(
        CHANGELIST, {"action": "allow_selected", ACTION_CHECKBOX_NAME: [pk], "post": "yes"}
    )
    assert Approval.objects.get(approval_id=aid).status == "pending"
    gate.abort_tool_decision(slot, aid)


def test_changelist_search_filters_and_detail_page_work_with_the_hosts_user(alice, reviewer):
    aid, slot = _gate(alice)
    client = _client(reviewer)
    for query in (
        {},
        {"q": aid},
        {"q": "shell"},
        {"status__exact": "pending"},
        {"awaiting": "yes"},
    ):
        response = client.get(CHANGELIST, query)
        assert response.status_code == 200, query
        assert aid in response.content.decode()
    pk = Approval.objects.get(approval_id=aid).pk
    detail = client.get(f"{CHANGELIST}{pk}/change/")
    assert detail.status_code == 200
    assert "alice@example.com" in detail.content.decode()
    gate.abort_tool_decision(slot, aid)


def test_csv_export_names_the_hosts_users(alice, reviewer):
    aid, slot = _gate(alice, tool="send_email")
    assert gate.resolve_tool_decision(aid, "deny", user=reviewer, reason="spam")
    gate.wait_tool_decision(slot, aid)
    pk = Approval.objects.get(approval_id=aid).pk
    response = _client(reviewer).post(
        CHANGELIST, {"action": "export_csv", ACTION_CHECKBOX_NAME: [pk]}
    )
    assert response.status_code == 200
    text = b"".join(response.streaming_content).decode()
    assert aid in text and "alice@example.com" in text and "reviewer@example.com" in text


def test_rule_admin_works_with_the_hosts_user_model(alice, make_user):
    from approvals.models import Rule

    admin_user = make_user("root@example.com", staff=True)
    admin_user.is_superuser = True
    admin_user.save()
    Rule.objects.create(user=alice, tool_name="read_*", decision="allow", created_by=alice)
    client = _client(admin_user)
    listing = client.get("/backoffice/approvals/rule/", {"q": "alice@example.com"})
    assert listing.status_code == 200
    assert "read_*" in listing.content.decode()
    assert client.get("/backoffice/approvals/rule/add/").status_code == 200
