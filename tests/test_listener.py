"""The process listener's re-check keeps running whatever a pass runs into."""

from __future__ import annotations

import pytest
from django.test import override_settings
from django.utils import timezone

from approvals import gate
from approvals import listener as listener_module
from approvals.listener import Listener, get_listener
from approvals.models import Approval

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
    monkeypatch.setattr(listener_module, "close_old_connections", cleanup_fails)
    listener._kick.set()
    try:
        # Decided as another process would: the row changes, nothing is announced here.
        Approval.objects.filter(approval_id=aid).update(
            status="allowed", decided_via="api", decided_at=timezone.now()
        )
        assert slot.wait(5) == "allowed"
        assert failures == ["database gone"]
        assert gate.wait_tool_decision(slot, aid) == "allow"
    finally:
        listener.unregister(slot)
