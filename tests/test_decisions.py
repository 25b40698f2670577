"""The decision path stands on its own: deciding starts no thread and no listener."""

from __future__ import annotations

import threading
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone

from approvals import listener
from approvals.decisions import decide
from approvals.models import Approval, Status, Via

pytestmark = pytest.mark.django_db(transaction=True)


def _row(approval_id: str, **fields) -> Approval:
    now = timezone.now()
    defaults = {"session_id": "s", "tool_name": "t", "expires_at": now + timedelta(hours=1)}
    return Approval.objects.create(approval_id=approval_id, **{**defaults, **fields})


def test_deciding_starts_no_thread():
    listener.shutdown()
    _row("decide-alone")
    before = {t.ident for t in threading.enumerate()}
    outcome = decide("decide-alone", Status.ALLOWED, via=Via.API)
    assert outcome.won and outcome.status == Status.ALLOWED
    assert listener.current() is None
    assert {t.ident for t in threading.enumerate()} - before == set()
    assert Approval.objects.get(approval_id="decide-alone").status == Status.ALLOWED


def test_the_sweep_command_starts_no_listener():
    listener.shutdown()
    _row("sweep-alone", expires_at=timezone.now() - timedelta(seconds=1))
    out = StringIO()
    call_command("approvals_sweep", stdout=out)
    assert "expired 1" in out.getvalue()
    assert listener.current() is None
    assert Approval.objects.get(approval_id="sweep-alone").status == Status.EXPIRED
