"""Edit before allow, get_decision and mark_executed: the Python API, HTTP and WebSocket."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from asgiref.sync import sync_to_async
from django.test import Client

from approvals import execution, gate
from approvals.errors import RequestError
from approvals.models import Approval
from tests.test_consumer import next_of, session_cookie, ws

CONFIRM = "/api/inference/tool-confirm"
SCHEMA = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "depth": {"type": "integer", "maximum": 3}},
    "required": ["path"],
    "additionalProperties": False,
}


@pytest.fixture
def alice(django_user_model):
    return django_user_model.objects.create_user("alice")


@pytest.fixture
def as_alice(alice):
    client = Client()
    client.force_login(alice)
    return client


def gated(user, *, editable=True, schema=SCHEMA, session="s1", **kw) -> str:
    aid = gate.new_approval_id()
    gate.begin_tool_decision(
        session,
        aid,
        tool_name="rm",
        arguments={"path": "build logs"},
        user=user,
        description="Clean the build output",
        editable=editable,
        arguments_schema=schema,
        **kw,
    )
    return aid


def post(client, body):
    return client.post(CONFIRM, data=json.dumps(body), content_type="application/json")


def row(aid) -> Approval:
    return Approval.objects.get(approval_id=aid)


# -- gate time ---------------------------------------------------------------


@pytest.mark.django_db
def test_an_invalid_schema_is_refused_at_gate_time(alice):
    with pytest.raises(ValueError, match="not a valid JSON Schema"):
        gated(alice, schema={"type": "no-such-type"})
    assert not Approval.objects.exists()


# -- HTTP --------------------------------------------------------------------


@pytest.mark.django_db
def test_http_allow_with_edit_keeps_proposal_and_edit(as_alice, alice):
    aid = gated(alice)
    r = post(as_alice, {"approval_id": aid, "decision": "allow", "arguments": {"path": "build"}})
    assert r.status_code == 200, r.content
    assert r.json() == {"resolved": True, "approval_id": aid, "status": "allowed"}
    a = row(aid)
    assert a.arguments == {"path": "build logs"}
    assert a.edited_arguments == {"path": "build"}
    assert a.decided_by_id == alice.pk
    d = gate.get_decision(aid)
    assert (d.allowed, d.arguments, d.message, d.status) == (
        True,
        {"path": "build"},
        None,
        "allowed",
    )
    assert d.decided_via == "web" and d.decided_by_id == alice.pk


@pytest.mark.django_db
def test_http_edit_equal_to_proposal_stores_no_edit(as_alice, alice):
    aid = gated(alice)
    r = post(
        as_alice, {"approval_id": aid, "decision": "allow", "arguments": {"path": "build logs"}}
    )
    assert r.status_code == 200
    assert row(aid).edited_arguments is None


@pytest.mark.django_db
def test_http_not_editable(as_alice, alice):
    aid = gated(alice, editable=False, schema=None)
    r = post(as_alice, {"approval_id": aid, "decision": "allow", "arguments": {"path": "x"}})
    assert r.status_code == 400
    assert r.json()["error"] == "not_editable"
    assert r.json()["resolved"] is False
    assert row(aid).status == "pending" and row(aid).edited_arguments is None


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("arguments", "path"),
    [({"path": 7}, "$.path"), ({"path": "b", "depth": 9}, "$.depth"), ({}, "path")],
)
def test_http_invalid_arguments_name_the_path(as_alice, alice, arguments, path):
    aid = gated(alice)
    r = post(as_alice, {"approval_id": aid, "decision": "allow", "arguments": arguments})
    assert r.status_code == 400
    assert r.json()["error"] == "invalid_arguments"
    assert path in r.json()["detail"]
    assert row(aid).status == "pending"


@pytest.mark.django_db
@pytest.mark.parametrize("body", [{"decision": "deny"}, {"decision": "allow", "arguments": [1]}])
def test_http_arguments_with_deny_or_not_an_object(as_alice, alice, body):
    aid = gated(alice)
    body = {"arguments": {"path": "x"}, "approval_id": aid, **body}
    r = post(as_alice, body)
    assert r.status_code == 400
    assert r.json()["error"] == "invalid_field"
    assert row(aid).status == "pending"


@pytest.mark.django_db
def test_http_arguments_with_a_lone_surrogate_is_400(as_alice, alice):
    aid = gated(alice)
    body = json.dumps({"approval_id": aid, "decision": "allow", "arguments": {"path": "X"}})
    raw = body.replace('"X"', '"\\ud800"')
    r = as_alice.post(CONFIRM, data=raw, content_type="application/json")
    assert r.status_code == 400 and r.json()["error"] == "invalid_field"


@pytest.mark.django_db
def test_http_edit_after_a_decision_is_409_and_changes_nothing(as_alice, alice):
    aid = gated(alice)
    assert gate.resolve_tool_decision(aid, "deny")
    r = post(as_alice, {"approval_id": aid, "decision": "allow", "arguments": {"path": "b"}})
    assert r.status_code == 409
    assert row(aid).status == "denied" and row(aid).edited_arguments is None


@pytest.mark.django_db
def test_no_schema_accepts_any_object(as_alice, alice):
    aid = gated(alice, schema=None)
    r = post(as_alice, {"approval_id": aid, "decision": "allow", "arguments": {"anything": [1]}})
    assert r.status_code == 200
    assert gate.get_decision(aid).arguments == {"anything": [1]}


# -- the waiter runs what was approved --------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_waiting_agent_gets_the_edit(alice):
    aid = gate.new_approval_id()
    slot = gate.begin_tool_decision(
        "s1", aid, tool_name="rm", arguments={"path": "a"}, user=alice, editable=True
    )
    answer: list = []
    waiter = threading.Thread(target=lambda: answer.append(gate.wait_tool_decision(slot, aid)))
    waiter.start()
    client = Client()
    client.force_login(alice)
    r = post(client, {"approval_id": aid, "decision": "allow", "arguments": {"path": "b"}})
    assert r.status_code == 200
    waiter.join(10)
    assert answer == ["allow"]
    assert gate.get_decision(aid).arguments == {"path": "b"}


# -- get_decision / mark_executed --------------------------------------------------


@pytest.mark.django_db
def test_get_decision_of_a_denied_call(alice):
    aid = gated(alice)
    gate.resolve_tool_decision(aid, "deny", reason="too broad")
    d = gate.get_decision(aid)
    assert d.allowed is False and d.status == "denied" and d.reason == "too broad"
    assert d.arguments == {"path": "build logs"}
    assert d.message == gate.denial_message(aid) and "too broad" in d.message
    with pytest.raises(Approval.DoesNotExist):
        gate.get_decision("nope")


@pytest.mark.django_db
def test_mark_executed_once_and_only_when_allowed(alice):
    aid = gated(alice)
    assert gate.mark_executed(aid) is False  # pending
    assert execution.record_execution(aid) == "not_allowed"
    gate.resolve_tool_decision(aid, "allow")
    assert gate.mark_executed(aid, ok=False, summary="exit 1") is True
    assert gate.mark_executed(aid) is False
    assert execution.record_execution(aid) == "already_executed"
    assert execution.record_execution("unknown") == "not_found"
    a = row(aid)
    assert a.executed_at is not None and a.execution_ok is False
    assert a.execution_summary == "exit 1"
    denied = gated(alice)
    gate.resolve_tool_decision(denied, "deny")
    assert gate.mark_executed(denied) is False
    assert row(denied).executed_at is None


@pytest.mark.django_db(transaction=True)
def test_async_twins(alice):
    aid = gated(alice)

    async def main():
        assert await gate.aresolve_tool_decision(aid, "allow")
        d = await gate.aget_decision(aid)
        assert d.allowed
        assert await gate.amark_executed(aid, summary="done") is True
        assert await gate.amark_executed(aid) is False

    asyncio.run(main())


@pytest.mark.django_db
def test_edit_through_decide_is_one_conditional_update(alice):
    from approvals.decisions import decide

    aid = gated(alice)
    with pytest.raises(ValueError):
        decide(aid, "denied", via="api", edited_arguments={"path": "b"})
    first = decide(aid, "allowed", via="api", edited_arguments={"path": "b"})
    second = decide(aid, "allowed", via="api", edited_arguments={"path": "c"})
    assert first.won and not second.won and second.error == "already_decided"
    assert row(aid).edited_arguments == {"path": "b"}
    with pytest.raises(RequestError) as info:
        decide(gated(alice, editable=False), "allowed", via="api", edited_arguments={})
    assert info.value.code == "not_editable"


# -- WebSocket ---------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_websocket_edit_codes_and_event(alice):
    cookie = session_cookie(alice)
    fixed = sync_to_async(gated)

    async def main():
        aid = await fixed(alice)
        plain = await fixed(alice, editable=False, schema=None)
        comm = await ws(cookie)
        snap = await comm.receive_json_from(timeout=5)
        item = next(i for i in snap["pending"] if i["approval_id"] == aid)
        assert item["description"] == "Clean the build output"
        assert item["editable"] is True and item["arguments_schema"] == SCHEMA
        assert item["user"] == "alice"

        async def confirm(**body):
            await comm.send_json_to({"type": "tool_confirm", "decision": "allow", **body})
            return await next_of(comm, "tool_confirm_result")

        bad = await confirm(approval_id=plain, arguments={"path": "x"})
        assert bad["resolved"] is False and bad["error"] == "not_editable"
        bad = await confirm(approval_id=aid, arguments={"path": 1})
        assert bad["error"] == "invalid_arguments" and "$.path" in bad["detail"]
        bad = await confirm(approval_id=aid, decision="deny", arguments={"path": "x"})
        assert bad["error"] == "invalid_field"
        ok = await confirm(approval_id=aid, arguments={"path": "build"})
        assert ok["resolved"] is True and ok["status"] == "allowed"
        msg = await next_of(comm, "tool_decision")
        assert msg["approval_id"] == aid
        assert msg["edited_arguments"] == {"path": "build"}
        await comm.disconnect()

    asyncio.run(asyncio.wait_for(main(), 30))
