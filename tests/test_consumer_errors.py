"""A decision the database refuses, or the app rejects late, is an error reply, never a
closed socket."""

from __future__ import annotations

from unittest import mock

import pytest
from django.db import OperationalError

from approvals.models import Approval, Status

from .test_consumer import agate, confirm, run, snapshot_of, users, ws  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


def test_database_down_during_tool_confirm_is_an_error_reply(users):  # noqa: F811
    alice, cookie = users["alice"]

    async def scenario():
        aid, _slot = await agate(user=alice)
        comm = await ws(cookie)
        await snapshot_of(comm)
        broken = mock.patch(
            "approvals.decisions._update_sql",
            side_effect=OperationalError("database is locked"),
        )
        with broken:
            failed = await confirm(comm, approval_id=aid, decision="allow")
        again = await confirm(comm, approval_id=aid, decision="deny")
        await comm.disconnect()
        return aid, failed, again

    aid, failed, again = run(scenario())
    assert failed["resolved"] is False and failed["error"] == "database_unavailable"
    assert failed["detail"]
    assert again["resolved"] is True and again["status"] == Status.DENIED
    assert Approval.objects.get(approval_id=aid).status == Status.DENIED


def test_remember_session_on_a_call_without_a_session_is_an_error_reply(users):  # noqa: F811
    alice, cookie = users["alice"]

    async def scenario():
        aid, _slot = await agate(session="", user=alice)
        comm = await ws(cookie)
        await snapshot_of(comm)
        reply = await confirm(comm, approval_id=aid, decision="allow", remember="session")
        still = await confirm(comm, approval_id=aid, decision="allow")
        await comm.disconnect()
        return aid, reply, still

    aid, reply, still = run(scenario())
    assert reply["resolved"] is False and reply["error"] == "invalid_field"
    assert still["resolved"] is True
