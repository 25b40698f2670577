"""The Approval admin: read-only for everyone, bulk decisions for deciders, CSV export."""

from __future__ import annotations

import csv
import io
import threading
from datetime import timedelta

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from approvals import gate
from approvals.models import Approval

CHANGELIST = reverse("admin:approvals_approval_changelist")


def make_approval(user=None, session="s1", tool="shell", status="pending", **kw) -> Approval:
    now = timezone.now()
    kw.setdefault("created_at", now)
    kw.setdefault("expires_at", now + timedelta(hours=1))
    kw.setdefault("arguments", {"cmd": "ls"})
    return Approval.objects.create(
        approval_id=gate.new_approval_id(),
        session_id=session,
        user=user,
        tool_name=tool,
        status=status,
        **kw,
    )


def staff(django_user_model, name, *codenames):
    user = django_user_model.objects.create_user(name, is_staff=True)
    perms = Permission.objects.filter(content_type__app_label="approvals", codename__in=codenames)
    user.user_permissions.add(*perms)
    client = Client()
    client.force_login(user)
    return user, client


@pytest.fixture
def decider(django_user_model):
    return staff(django_user_model, "dora", "view_approval", "decide_approval")


@pytest.fixture
def viewer(django_user_model):
    return staff(django_user_model, "vic", "view_approval")


@pytest.fixture
def superuser(django_user_model):
    user = django_user_model.objects.create_superuser("root", "root@example.com", None)
    client = Client()
    client.force_login(user)
    return user, client


def run_action(client, action, approvals, **extra):
    data = {"action": action, ACTION_CHECKBOX_NAME: [a.pk for a in approvals], **extra}
    return client.post(CHANGELIST, data, follow=False)


def messages_of(response) -> list[str]:
    return [str(m) for m in response.wsgi_request._messages]


# -- read-only -------------------------------------------------------------------


@pytest.mark.django_db
def test_nobody_may_add_change_or_delete_not_even_a_superuser(superuser):
    _, client = superuser
    a = make_approval(arguments={"cmd": "<script>alert(1)</script>", "n": 1})
    change = reverse("admin:approvals_approval_change", args=[a.pk])
    assert client.get(reverse("admin:approvals_approval_add")).status_code == 403
    assert client.get(reverse("admin:approvals_approval_delete", args=[a.pk])).status_code == 403
    deleted = client.post(reverse("admin:approvals_approval_delete", args=[a.pk]), {"post": "yes"})
    assert deleted.status_code == 403
    r = client.post(change, {"status": "allowed", "reason": "edited"})
    assert r.status_code == 403
    a.refresh_from_db()
    assert (a.status, a.reason) == ("pending", "")
    assert Approval.objects.filter(pk=a.pk).exists()

    page = client.get(change)  # viewable, read-only
    assert page.status_code == 200
    html = page.content.decode()
    assert 'name="_save"' not in html
    assert "<script>alert(1)</script>" not in html
    assert '<pre class="approvals-arguments">{\n  &quot;cmd&quot;: &quot;&lt;script&gt;' in html


@pytest.mark.django_db
def test_delete_selected_is_gone_and_decide_actions_need_the_permission(decider, viewer, superuser):
    make_approval()
    choices = {}
    for name, (_, client) in {"decider": decider, "viewer": viewer, "root": superuser}.items():
        r = client.get(CHANGELIST)
        assert r.status_code == 200
        choices[name] = {value for value, _ in r.context["action_form"].fields["action"].choices}
    assert choices["decider"] == {"", "allow_selected", "deny_selected", "export_csv"}
    assert choices["root"] == choices["decider"]
    assert choices["viewer"] == {"", "export_csv"}


# -- the decide actions ------------------------------------------------------------


@pytest.mark.django_db
def test_the_action_asks_first_then_decides_with_post_yes(decider):
    user, client = decider
    p1, p2 = make_approval(tool="rm"), make_approval(arguments={"x": "<b>"})
    done = make_approval(status="denied", decided_via="api")
    r = run_action(client, "allow_selected", [p1, p2, done], index=0)
    assert r.status_code == 200
    assert r.templates[0].name == "admin/approvals/approval/decide_selected_confirmation.html"
    html = r.content.decode()
    assert "rm" in html and "&lt;b&gt;" in html and "<b>" not in html
    assert "{&quot;x&quot;: &quot;&lt;b&gt;&quot;}" in html  # the arguments as JSON
    assert p1.approval_id in html and p2.approval_id in html and done.approval_id not in html
    assert 'name="post" value="yes"' in html and 'name="reason"' in html
    assert "1 selected call is already decided" in html
    assert [c.pk for c in r.context["batch"]] == [p1.pk, p2.pk]
    assert Approval.objects.filter(status="pending").count() == 2  # nothing decided yet

    r = run_action(client, "allow_selected", [p1, p2], post="yes", reason="batch ok", skipped=1)
    assert r.status_code == 302
    assert messages_of(r) == ["Decided 2, skipped 1 (already decided)."]
    for a in (p1, p2):
        a.refresh_from_db()
        assert (a.status, a.decided_via, a.decided_by, a.reason) == (
            "allowed",
            "admin",
            user,
            "batch ok",
        )
    done.refresh_from_db()
    assert done.status == "denied"


@pytest.mark.django_db
def test_post_yes_decides_at_once_and_counts_skips(decider):
    _, client = decider
    pending = make_approval()
    expired = make_approval(expires_at=timezone.now() - timedelta(seconds=1))
    allowed = make_approval(status="allowed", decided_via="web")
    r = run_action(client, "deny_selected", [pending, expired, allowed], post="yes")
    assert messages_of(r) == ["Decided 1, skipped 2 (already decided)."]
    statuses = {a.pk: a.status for a in Approval.objects.all()}
    assert statuses == {pending.pk: "denied", expired.pk: "expired", allowed.pk: "allowed"}


@pytest.mark.django_db
def test_nothing_pending_reports_without_a_confirmation_page(decider):
    _, client = decider
    a = make_approval(status="cancelled", decided_via="cancel")
    r = run_action(client, "allow_selected", [a], index=0)
    assert r.status_code == 302
    assert messages_of(r) == ["Decided 0, skipped 1 (already decided)."]


@pytest.mark.django_db
def test_a_too_long_reason_shows_the_form_again(decider):
    _, client = decider
    a = make_approval()
    r = run_action(client, "deny_selected", [a], post="yes", reason="x" * 5000)
    assert r.status_code == 200
    assert r.context["form"].errors["reason"]
    assert Approval.objects.get(pk=a.pk).status == "pending"


@pytest.mark.django_db
@pytest.mark.parametrize("action", ["allow_selected", "deny_selected"])
def test_without_the_permission_a_hand_made_post_decides_nothing(viewer, action):
    _, client = viewer
    a = make_approval()
    r = run_action(client, action, [a], post="yes", index=0)
    assert r.status_code in (200, 302)
    assert Approval.objects.get(pk=a.pk).status == "pending"
    assert "No action selected." in messages_of(r)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("action", "answer"), [("allow_selected", "allow"), ("deny_selected", "deny")]
)
def test_a_waiting_agent_wakes_with_the_admin_decision(decider, action, answer):
    _, client = decider
    aid = gate.new_approval_id()
    slot = gate.begin_tool_decision("s1", aid, tool_name="deploy")
    box = {}
    waiter = threading.Thread(target=lambda: box.update(answer=gate.wait_tool_decision(slot, aid)))
    waiter.start()
    row = Approval.objects.get(approval_id=aid)
    r = run_action(client, action, [row], post="yes", reason="from the admin")
    waiter.join(5)
    assert not waiter.is_alive()
    assert box["answer"] == answer
    assert messages_of(r) == ["Decided 1, skipped 0 (already decided)."]
    if answer == "deny":
        assert gate.denial_message(aid).endswith("Reason: from the admin")


# -- export --------------------------------------------------------------------------


@pytest.mark.django_db
def test_export_csv_streams_every_audit_column(viewer, decider, django_user_model):
    _, client = viewer
    dora = decider[0]
    owner = django_user_model.objects.create_user("olga")
    start = timezone.now() - timedelta(minutes=2)
    a = make_approval(
        owner,
        session="chat-1",
        tool="=HYPERLINK()",
        arguments={"cmd": "rm -rf /tmp/x", "ü": 1},
        created_at=start,
        status="denied",
        decided_via="admin",
        decided_by=dora,
        decided_at=start + timedelta(seconds=90),
        reason="no, thanks",
        tool_call_id="call_1",
    )
    b = make_approval(created_at=start + timedelta(seconds=1))
    make_approval()  # not selected
    r = run_action(client, "export_csv", [a, b], index=0)
    assert r.status_code == 200
    assert r["Content-Type"] == "text/csv; charset=utf-8"
    assert r["Content-Disposition"].startswith('attachment; filename="approvals-')
    rows = list(csv.reader(io.StringIO(b"".join(r.streaming_content).decode())))
    assert rows[0] == [
        "approval_id",
        "session_id",
        "user",
        "tool_name",
        "tool_call_id",
        "arguments",
        "status",
        "decided_via",
        "decided_by",
        "reason",
        "created_at",
        "decided_at",
        "expires_at",
        "seconds_to_decision",
        "description",
        "editable",
        "edited_arguments",
        "executed_at",
        "execution_ok",
        "execution_summary",
        "agent_key",
    ]
    assert rows[1] == [
        a.approval_id,
        "chat-1",
        "olga",
        "'=HYPERLINK()",
        "call_1",
        '{"cmd": "rm -rf /tmp/x", "ü": 1}',
        "denied",
        "admin",
        "dora",
        "no, thanks",
        a.created_at.isoformat(),
        a.decided_at.isoformat(),
        a.expires_at.isoformat(),
        "90.000",
        "",
        "no",
        "",
        "",
        "",
        "",
        "",
    ]
    assert rows[2][0] == b.approval_id and rows[2][2] == "" and rows[2][11] == ""
    assert len(rows) == 3


@pytest.mark.django_db
def test_a_decider_without_view_permission_still_sees_the_list(django_user_model):
    _, client = staff(django_user_model, "dee", "decide_approval")
    a = make_approval()
    r = client.get(CHANGELIST)
    assert r.status_code == 200
    assert "allow_selected" in {v for v, _ in r.context["action_form"].fields["action"].choices}
    run_action(client, "allow_selected", [a], post="yes")
    assert Approval.objects.get(pk=a.pk).status == "allowed"


@pytest.mark.django_db
def test_select_across_confirms_only_pending_calls_and_caps_the_batch(decider, monkeypatch):
    import approvals.admin.approval

    monkeypatch.setattr(approvals.admin.approval, "MAX_BATCH", 2)
    _, client = decider
    now = timezone.now()
    oldest = [make_approval(created_at=now - timedelta(minutes=m)) for m in (9, 8, 7)]
    make_approval(status="denied", decided_via="web")
    r = client.post(
        CHANGELIST,
        {"action": "deny_selected", "select_across": "1", "index": 0, ACTION_CHECKBOX_NAME: ["x"]},
    )
    assert r.status_code == 200
    assert [c.pk for c in r.context["batch"]] == [oldest[0].pk, oldest[1].pk]
    assert r.context["over_batch"] is True
    assert r.context["skipped"] == 1
    assert "Only the oldest 2 pending calls are included" in r.content.decode()


@pytest.mark.django_db
def test_process_leases_are_listed_read_only(superuser):
    from approvals.models import ProcessLease

    _, client = superuser
    lease = ProcessLease.objects.create(key="k1", hostname="web-1", pid=42)
    r = client.get(reverse("admin:approvals_processlease_changelist"))
    assert r.status_code == 200 and "web-1" in r.content.decode()
    assert client.get(reverse("admin:approvals_processlease_add")).status_code == 403
    delete = reverse("admin:approvals_processlease_delete", args=[lease.pk])
    assert client.post(delete, {"post": "yes"}).status_code == 403
    assert ProcessLease.objects.filter(pk=lease.pk).exists()


@pytest.mark.django_db
def test_csv_and_detail_show_the_edit_and_the_run(admin_client, django_user_model):
    from approvals import gate
    from approvals.admin.export import csv_rows
    from approvals.decisions import decide

    aid = gate.new_approval_id()
    gate.begin_tool_decision(
        "s-x", aid, tool_name="rm", arguments={"p": "a b"}, description="tidy", editable=True
    )
    decide(aid, "allowed", via="api", edited_arguments={"p": "a"})
    assert gate.mark_executed(aid, summary="removed a")
    rows = list(csv_rows(Approval.objects.filter(approval_id=aid)))
    row = dict(zip(rows[0], rows[1], strict=True))
    assert row["description"] == "tidy" and row["editable"] == "yes"
    assert row["arguments"] == '{"p": "a b"}' and row["edited_arguments"] == '{"p": "a"}'
    assert row["executed_at"] and row["execution_ok"] == "yes"
    assert row["execution_summary"] == "removed a"
    pk = Approval.objects.get(approval_id=aid).pk
    page = admin_client.get(f"/admin/approvals/approval/{pk}/change/").content.decode()
    assert "tidy" in page and "removed a" in page and "&quot;p&quot;: &quot;a&quot;" in page
