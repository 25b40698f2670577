"""App conventions: settings, system checks, the sweep, indexes."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.checks import Error, Warning
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from approvals import checks, gate
from approvals.conf import DEFAULTS, setting
from approvals.listener import get_listener
from approvals.models import Approval, ProcessLease


def test_settings_defaults_and_override():
    assert setting("DECISION_TIMEOUT") == 3600
    with override_settings(APPROVALS={"DECISION_TIMEOUT": 5}):
        assert setting("DECISION_TIMEOUT") == 5
        assert setting("RECHECK_INTERVAL") == DEFAULTS["RECHECK_INTERVAL"]
    assert setting("DECISION_TIMEOUT") == 3600


def test_unknown_setting_is_an_error():
    with override_settings(APPROVALS={"DECISION_TIMEOUT": 5, "RECHEK_INTERVAL": 1}):
        with pytest.raises(ImproperlyConfigured, match="RECHEK_INTERVAL"):
            setting("DECISION_TIMEOUT")
        errors = checks.check_settings()
        assert [e.id for e in errors] == ["approvals.E001"]
        assert isinstance(errors[0], Error)


def test_invalid_setting_values_are_errors():
    with override_settings(APPROVALS={"DECISION_TIMEOUT": 0, "LEASE_TIMEOUT": 6}):
        found = {(e.id, e.msg.split("'")[1]) for e in checks.check_settings()}
    # One id per problem: a value that is not a positive number, and a lease too short.
    assert found == {("approvals.E002", "DECISION_TIMEOUT"), ("approvals.E003", "LEASE_TIMEOUT")}


def test_site_settings_pass_the_checks():
    assert checks.check_settings() == []
    assert checks.check_sqlite() == []


def test_inmemory_layer_without_debug_warns():
    layers = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    with override_settings(CHANNEL_LAYERS=layers, DEBUG=False):
        result = checks.check_channel_layer()
    assert len(result) == 1
    assert isinstance(result[0], Warning) and result[0].id == "approvals.W001"
    with override_settings(CHANNEL_LAYERS=layers, DEBUG=True):
        assert checks.check_channel_layer() == []


def test_missing_channel_layer_warns():
    with override_settings(CHANNEL_LAYERS={}):
        assert [w.id for w in checks.check_channel_layer()] == ["approvals.W004"]


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_sqlite_without_wal_or_immediate_warns():
    dbs = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "x.sqlite3"}}
    with override_settings(DATABASES=dbs):
        ids = [w.id for w in checks.check_sqlite()]
    assert ids == ["approvals.W002", "approvals.W003"]


@pytest.mark.django_db(transaction=True)
def test_sweep_expires_overdue_calls_idempotently():
    aid, slot = gate.new_approval_id(), None
    slot = gate.begin_tool_decision("sw", aid, tool_name="t", timeout=60)
    Approval.objects.filter(approval_id=aid).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    out = StringIO()
    call_command("approvals_sweep", stdout=out)
    assert "expired 1" in out.getvalue()
    row = Approval.objects.get(approval_id=aid)
    assert (row.status, row.decided_via) == ("expired", "sweep")
    out = StringIO()
    call_command("approvals_sweep", stdout=out)
    assert "expired 0, abandoned 0" in out.getvalue()
    assert gate.wait_tool_decision(slot, aid) == "deny"


@pytest.mark.django_db(transaction=True)
def test_sweep_abandons_calls_of_a_dead_process_only():
    # Earlier transactional tests flushed this process's lease row: write it again.
    get_listener().lease.written = False
    get_listener().ensure_lease()
    live = gate.new_approval_id()
    live_slot = gate.begin_tool_decision("sw", live, tool_name="t")
    dead = gate.new_approval_id()
    gate.begin_tool_decision("sw", dead, tool_name="t")
    ProcessLease.objects.create(key="gone-1", heartbeat_at=timezone.now() - timedelta(minutes=5))
    long_ago = timezone.now() - timedelta(minutes=2)
    Approval.objects.filter(approval_id=dead).update(waiter="gone-1", created_at=long_ago)
    Approval.objects.filter(approval_id=live).update(created_at=long_ago)
    unattended = gate.new_approval_id()
    gate.begin_tool_decision("sw", unattended, tool_name="t")
    # Nobody waits for this one (a deferred framework approval): the sweep keeps it.
    Approval.objects.filter(approval_id=unattended).update(waiter="", created_at=long_ago)

    out = StringIO()
    call_command("approvals_sweep", stdout=out)
    assert "abandoned 1" in out.getvalue()
    assert Approval.objects.get(approval_id=dead).status == "abandoned"
    assert Approval.objects.get(approval_id=live).status == "pending"
    assert Approval.objects.get(approval_id=unattended).status == "pending"
    assert gate.resolve_tool_decision(dead, "allow") is False
    assert gate.resolve_tool_decision(live, "allow") is True
    assert gate.wait_tool_decision(live_slot, live) == "allow"
    assert gate.denial_message(dead).startswith("The process waiting")


@pytest.mark.django_db
def test_permission_ships_in_the_migration():
    from django.contrib.auth.models import Permission

    perm = Permission.objects.get(codename="decide_approval")
    assert perm.name == "Can allow or deny pending tool calls"
    assert perm.content_type.app_label == "approvals"


@pytest.mark.django_db
@pytest.mark.skipif(connection.vendor != "sqlite", reason="reads SQLite's query plan")
def test_pending_queries_use_indexes():
    def plan(qs):
        sql, params = qs.query.sql_with_params()
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN QUERY PLAN " + sql, params)
            return " ".join(str(row) for row in cursor.fetchall())

    now = timezone.now()
    Approval.objects.bulk_create(
        Approval(
            approval_id=f"a{i}",
            session_id=f"s{i % 500}",
            status="pending" if i % 50 == 0 else "allowed",
            tool_name="t",
            expires_at=now,
        )
        for i in range(5000)
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    pending_user = Approval.objects.filter(status="pending", user_id=1).order_by("created_at")
    assert "approvals_pending_user" in plan(pending_user)
    pending_session = Approval.objects.filter(status="pending", session_id="s").order_by(
        "created_at"
    )
    assert "approvals_pending_session" in plan(pending_session)
    latest = Approval.objects.order_by("-created_at")[:100]
    assert "approvals_latest" in plan(latest) or "created_at" in plan(latest)


def test_app_config_pins_the_auto_field():
    from django.apps import apps

    assert apps.get_app_config("approvals").default_auto_field == "django.db.models.BigAutoField"
