"""The gate with the host's users: UUID primary keys, email login."""

from __future__ import annotations

import asyncio
import threading
import uuid

import pytest

from approvals import gate
from approvals.decisions import decide
from approvals.models import Approval, Rule

pytestmark = pytest.mark.django_db(transaction=True)


def _wait_in_thread(slot, aid):
    box: dict = {}
    thread = threading.Thread(target=lambda: box.update(answer=gate.wait_tool_decision(slot, aid)))
    thread.start()
    return thread, box


def test_begin_resolve_wait_with_a_uuid_user(alice):
    aid = gate.new_approval_id()
    slot = gate.begin_tool_decision(
        "run-1", aid, tool_name="shell", arguments={"cmd": "ls"}, user=alice
    )
    row = Approval.objects.get(approval_id=aid)
    assert isinstance(row.user_id, uuid.UUID) and row.user == alice
    thread, box = _wait_in_thread(slot, aid)

    assert gate.resolve_tool_decision(aid, "allow", "run-1", user=alice, reason="fine") is True
    thread.join(5)
    assert box["answer"] == "allow"
    row.refresh_from_db()
    assert (row.status, row.decided_via, row.decided_by) == ("allowed", "api", alice)
    assert gate.resolve_tool_decision(aid, "deny", "run-1", user=alice) is False


def test_deny_feeds_the_reason_back(alice):
    aid = gate.new_approval_id()
    slot = gate.begin_tool_decision("run-2", aid, tool_name="email", user=alice)
    assert gate.resolve_tool_decision(aid, "deny", user=alice, reason="not today") is True
    assert gate.wait_tool_decision(slot, aid) == "deny"
    assert gate.denial_message(aid) == f"{gate.TOOL_REJECTED_MESSAGE} Reason: not today"


def test_async_twins_with_a_uuid_user(alice):
    async def run():
        aid = gate.new_approval_id()
        slot = await gate.abegin_tool_decision("run-3", aid, tool_name="shell", user=alice)
        waiter = asyncio.ensure_future(gate.await_tool_decision(slot, aid))
        assert await gate.aresolve_tool_decision(aid, "allow", "run-3", user=alice)
        return await asyncio.wait_for(waiter, 5)

    assert asyncio.run(run()) == "allow"


def test_visibility_and_decisions_follow_uuid_owners(alice, bob, reviewer):
    aid = gate.new_approval_id()
    slot = gate.begin_tool_decision("run-4", aid, tool_name="shell", user=alice)
    assert list(Approval.objects.visible_to(alice).values_list("approval_id", flat=True)) == [aid]
    assert not Approval.objects.visible_to(bob).exists()
    assert Approval.objects.visible_to(reviewer).filter(approval_id=aid).exists()

    assert decide(aid, "allowed", via="web", by=bob, viewer=bob).error == "not_found"
    outcome = decide(aid, "allowed", via="web", by=reviewer, viewer=reviewer)
    assert outcome.won and outcome.status == "allowed"
    assert gate.wait_tool_decision(slot, aid) == "allow"
    assert Approval.objects.get(approval_id=aid).decided_by == reviewer


def test_remembered_rule_answers_the_next_call_of_that_uuid_user_only(alice, bob):
    aid = gate.new_approval_id()
    slot = gate.begin_tool_decision("run-5", aid, tool_name="read_file", user=alice)
    assert decide(aid, "allowed", via="web", by=alice, viewer=alice, remember="always").won
    gate.wait_tool_decision(slot, aid)
    rule = Rule.objects.get()
    assert rule.user == alice and rule.decision == "allow"

    again = gate.new_approval_id()
    slot = gate.begin_tool_decision("run-6", again, tool_name="read_file", user=alice)
    assert gate.wait_tool_decision(slot, again, timeout=2) == "allow"
    assert Approval.objects.get(approval_id=again).decided_via == "rule"

    other = gate.new_approval_id()
    slot = gate.begin_tool_decision("run-7", other, tool_name="read_file", user=bob)
    assert Approval.objects.get(approval_id=other).status == "pending"
    gate.abort_tool_decision(slot, other)


def test_the_sweep_command_runs_in_the_host(alice):
    from datetime import timedelta
    from io import StringIO

    from django.core.management import call_command
    from django.utils import timezone

    aid = gate.new_approval_id()
    slot = gate.begin_tool_decision("sweep-run", aid, tool_name="shell", user=alice)
    Approval.objects.filter(approval_id=aid).update(expires_at=timezone.now() - timedelta(1))
    out = StringIO()
    call_command("approvals_sweep", stdout=out)
    assert "expired 1" in out.getvalue()
    assert gate.wait_tool_decision(slot, aid) == "deny"
    assert Approval.objects.get(approval_id=aid).decided_via == "sweep"
