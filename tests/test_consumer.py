"""The WebSocket consumer at /ws/approvals/, driven through the site's real ASGI stack."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid

import pytest
from asgiref.sync import sync_to_async
from channels.auth import AuthMiddlewareStack
from channels.layers import get_channel_layer
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import Permission
from django.test import Client, override_settings
from django.urls import path

from approvals import decisions, gate
from approvals.consumers import ApprovalsConsumer
from approvals.listener import get_listener
from approvals.models import Approval, Rule, Status, Via
from approvals.routing import websocket_urlpatterns
from toolgate_site.asgi import application

pytestmark = pytest.mark.django_db(transaction=True)

ORIGIN = b"http://localhost"
TOOL_START_KEYS = {
    "type",
    "approval_id",
    "session_id",
    "tool_name",
    "tool_call_id",
    "arguments",
    "awaiting_confirmation",
    "created_at",
    "expires_at",
    "description",
    "editable",
    "user",
}
DECISION_KEYS = {
    "type",
    "approval_id",
    "session_id",
    "status",
    "decided_via",
    "decided_by",
    "reason",
    "edited_arguments",
}


@pytest.fixture
def users(django_user_model):
    alice = django_user_model.objects.create_user("alice")
    bob = django_user_model.objects.create_user("bob")
    boss = django_user_model.objects.create_user("boss")
    boss.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    return {
        name: (user, session_cookie(user))
        for name, user in (("alice", alice), ("bob", bob), ("boss", boss))
    }


def session_cookie(user) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 20))


async def ws(cookie=None, query="", origin=ORIGIN, app=application, path_="/ws/approvals/"):
    headers = [(b"origin", origin)] if origin else []
    if cookie:
        headers.append((b"cookie", f"sessionid={cookie}".encode()))
    comm = WebsocketCommunicator(app, path_ + query, headers=headers)
    connected, _ = await comm.connect(timeout=5)
    assert connected
    return comm


async def snapshot_of(comm) -> list:
    message = await comm.receive_json_from(timeout=5)
    assert message["type"] == "snapshot"
    return message["pending"]


async def next_of(comm, kind: str, timeout: float = 3) -> dict:
    """The next message of ``kind``; a socket's own decision may be pushed before its reply,
    so other messages met on the way are kept for later calls."""
    held = _held.setdefault(id(comm), [])
    for i, message in enumerate(held):
        if message["type"] == kind:
            return held.pop(i)
    while True:
        message = await comm.receive_json_from(timeout=timeout)
        if message["type"] == kind:
            return message
        assert kind in ("tool_confirm_result", "error"), message
        held.append(message)


_held: dict[int, list] = {}


async def agate(session="s1", user=None, **kw):
    aid = gate.new_approval_id()
    kw.setdefault("tool_name", "shell")
    kw.setdefault("arguments", {"cmd": "ls"})
    slot = await sync_to_async(gate.begin_tool_decision)(session, aid, user=user, **kw)
    _slots.append(slot)
    return aid, slot


_slots: list = []


@pytest.fixture(autouse=True)
def _remove_slots_left_waiting():
    """Calls gated here are never waited for: drop their slots so other tests see none."""
    yield
    listener = get_listener()
    while _slots:
        listener.unregister(_slots.pop())
    _held.clear()


async def confirm(comm, **fields) -> dict:
    await comm.send_json_to({"type": "tool_confirm", **fields})
    return await next_of(comm, "tool_confirm_result")


# -- connecting -----------------------------------------------------------


def test_anonymous_is_accepted_then_closed_with_4401():
    async def scenario():
        comm = WebsocketCommunicator(application, "/ws/approvals/", headers=[(b"origin", ORIGIN)])
        connected, _ = await comm.connect(timeout=5)
        assert connected  # the handshake completes, so a browser can read the code
        closed = await comm.receive_output(timeout=5)
        assert closed == {"type": "websocket.close", "code": 4401}

    run(scenario())


def test_foreign_or_missing_origin_is_refused(users):
    _, cookie = users["alice"]

    async def scenario():
        for headers in (
            [(b"origin", b"http://evil.example"), (b"cookie", f"sessionid={cookie}".encode())],
            [(b"cookie", f"sessionid={cookie}".encode())],
        ):
            comm = WebsocketCommunicator(application, "/ws/approvals/", headers=headers)
            connected, _ = await comm.connect(timeout=5)
            assert not connected

    run(scenario())


def test_consumer_has_no_channel_layer_channel_of_its_own():
    assert get_channel_layer(ApprovalsConsumer.channel_layer_alias) is None


def test_mounted_under_another_prefix_in_a_nested_router(users):
    _, cookie = users["alice"]
    app = AuthMiddlewareStack(
        URLRouter([path("deep/", URLRouter([path("er/", URLRouter(websocket_urlpatterns))]))])
    )

    async def scenario():
        comm = await ws(cookie, app=app, path_="/deep/er/approvals/")
        assert await snapshot_of(comm) == []
        await comm.disconnect()

    run(scenario())


# -- what a connection carries --------------------------------------------


def test_snapshot_lists_visible_pending_calls_oldest_first(users):
    alice, cookie = users["alice"]
    bob, _ = users["bob"]

    async def scenario():
        first, _ = await agate(user=alice, tool_call_id="c1")
        second, _ = await agate(session="s2", user=alice)
        await agate(user=bob)
        decided, _ = await agate(user=alice)
        await sync_to_async(gate.resolve_tool_decision)(decided, "deny")
        await agate(user=alice, timeout=0.01)  # past its deadline: not pending any more
        await asyncio.sleep(0.05)
        comm = await ws(cookie)
        pending = await snapshot_of(comm)
        assert [p["approval_id"] for p in pending] == [first, second]
        assert set(pending[0]) == TOOL_START_KEYS - {"type", "awaiting_confirmation"}
        assert pending[0]["tool_call_id"] == "c1" and pending[0]["arguments"] == {"cmd": "ls"}
        narrowed = await ws(cookie, query="?session_id=s2")
        assert [p["approval_id"] for p in await snapshot_of(narrowed)] == [second]
        await comm.disconnect()
        await narrowed.disconnect()

    run(scenario())


@override_settings(APPROVALS={"PENDING_LIMIT": 2})
def test_snapshot_respects_the_pending_limit(users):
    alice, cookie = users["alice"]

    async def scenario():
        ids = [(await agate(user=alice))[0] for _ in range(3)]
        comm = await ws(cookie)
        assert [p["approval_id"] for p in await snapshot_of(comm)] == ids[:2]
        await comm.disconnect()

    run(scenario())


def test_users_see_only_their_own_calls_and_a_decider_sees_all(users):
    alice, alice_cookie = users["alice"]
    _, bob_cookie = users["bob"]
    _, boss_cookie = users["boss"]

    async def scenario():
        a, b, boss = await ws(alice_cookie), await ws(bob_cookie), await ws(boss_cookie)
        for comm in (a, b, boss):
            assert await snapshot_of(comm) == []
        aid, _ = await agate(user=alice, tool_call_id="t1")
        started = await next_of(a, "tool_start")
        assert set(started) == TOOL_START_KEYS
        assert started["approval_id"] == aid and started["awaiting_confirmation"] is True
        assert (await next_of(boss, "tool_start"))["approval_id"] == aid
        # Bob neither sees it nor learns that it exists.
        assert await b.receive_nothing(timeout=0.3)
        result = await confirm(b, approval_id=aid, decision="allow")
        assert result["error"] == "not_found" and result["resolved"] is False
        assert "status" not in result
        result = await confirm(a, approval_id=aid, decision="allow", reason="ok")
        assert result == {
            "type": "tool_confirm_result",
            "approval_id": aid,
            "resolved": True,
            "status": "allowed",
        }
        for comm in (a, boss):
            decided = await next_of(comm, "tool_decision")
            assert set(decided) == DECISION_KEYS
            assert decided["status"] == "allowed" and decided["decided_via"] == "websocket"
            assert decided["decided_by"] == "alice" and decided["reason"] == "ok"
        assert await b.receive_nothing(timeout=0.3)
        for comm in (a, b, boss):
            await comm.disconnect()

    run(scenario())


def test_session_id_narrows_the_pushes(users):
    alice, cookie = users["alice"]

    async def scenario():
        comm = await ws(cookie, query="?session_id=wanted")
        await snapshot_of(comm)
        await agate(session="other", user=alice)
        aid, _ = await agate(session="wanted", user=alice)
        assert (await next_of(comm, "tool_start"))["approval_id"] == aid
        await comm.disconnect()

    run(scenario())


def test_decision_made_elsewhere_is_pushed(users):
    alice, cookie = users["alice"]
    boss, boss_cookie = users["boss"]

    async def scenario():
        comm = await ws(cookie)
        other = await ws(boss_cookie)
        await snapshot_of(comm)
        await snapshot_of(other)
        aid, _ = await agate(user=alice)
        await next_of(comm, "tool_start")
        await next_of(other, "tool_start")
        won = await sync_to_async(gate.resolve_tool_decision)(aid, "deny", user=boss, reason="no")
        assert won
        decided = await next_of(comm, "tool_decision")
        assert (decided["status"], decided["decided_via"]) == ("denied", "api")
        assert (decided["decided_by"], decided["reason"]) == ("boss", "no")
        await next_of(other, "tool_decision")
        # Another socket decides: this one hears about it.
        aid2, _ = await agate(user=alice)
        await next_of(comm, "tool_start")
        await next_of(other, "tool_start")
        assert (await confirm(other, approval_id=aid2, decision="allow"))["resolved"]
        decided = await next_of(comm, "tool_decision")
        assert (decided["approval_id"], decided["decided_by"]) == (aid2, "boss")
        # The HTTP endpoint: the socket hears about it too.
        aid3, _ = await agate(user=alice)
        await next_of(comm, "tool_start")
        http = Client(HTTP_HOST="localhost")
        await sync_to_async(http.force_login)(boss)
        response = await sync_to_async(http.post)(
            "/api/inference/tool-confirm",
            {"approval_id": aid3, "decision": "deny"},
            content_type="application/json",
        )
        assert response.status_code == 200, response.content
        decided = await next_of(comm, "tool_decision")
        assert (decided["approval_id"], decided["decided_via"]) == (aid3, "web")
        await comm.disconnect()
        await other.disconnect()

    run(scenario())


def test_rule_answered_call_arrives_not_awaiting_and_in_order(users):
    alice, cookie = users["alice"]

    async def scenario():
        await sync_to_async(Rule.objects.create)(user=alice, tool_name="read_*", decision="allow")
        comm = await ws(cookie)
        await snapshot_of(comm)
        aid, _ = await agate(user=alice, tool_name="read_file")
        started = await next_of(comm, "tool_start")
        assert (started["approval_id"], started["awaiting_confirmation"]) == (aid, False)
        decided = await next_of(comm, "tool_decision")
        assert (decided["status"], decided["decided_via"]) == ("allowed", "rule")
        await comm.disconnect()

    run(scenario())


# -- deciding over the socket -----------------------------------------------


def test_tool_confirm_wakes_the_waiter_and_records_the_decision(users):
    alice, cookie = users["alice"]
    box = {}

    async def scenario():
        comm = await ws(cookie)
        await snapshot_of(comm)
        aid, slot = await agate(session="s9", user=alice)
        waiter = threading.Thread(
            target=lambda: box.setdefault("answer", gate.wait_tool_decision(slot, aid))
        )
        waiter.start()
        result = await confirm(
            comm,
            approval_id=aid,
            decision="deny",
            session_id="s9",
            reason="risky",
            remember="session",
        )
        assert result["resolved"] and result["status"] == "denied"
        await asyncio.to_thread(waiter.join, 5)
        await comm.disconnect()
        return aid

    aid = run(scenario())
    assert box["answer"] == "deny"
    row = Approval.objects.get(approval_id=aid)
    assert (row.status, row.decided_via, row.decided_by, row.reason) == (
        "denied",
        "websocket",
        alice,
        "risky",
    )
    rule = Rule.objects.get()
    assert (rule.user, rule.session_id, rule.tool_name, rule.decision) == (
        alice,
        "s9",
        "shell",
        "deny",
    )


def test_every_error_code_and_the_socket_keeps_working(users):
    alice, cookie = users["alice"]
    bob, _ = users["bob"]

    async def scenario():
        comm = await ws(cookie)
        await snapshot_of(comm)
        mine, _ = await agate(session="s1", user=alice)
        theirs, _ = await agate(user=bob)

        async def frame(text=None, data=None) -> dict:
            await comm.send_to(text_data=text, bytes_data=data)
            return await next_of(comm, "error")

        garbage = await frame("{not json")
        assert (garbage["type"], garbage["error"]) == ("error", "invalid_json")
        assert garbage["detail"]
        assert (await frame("[1, 2]"))["error"] == "invalid_json"
        assert (await frame('{"type": "x", "type": "y"}'))["error"] == "invalid_json"
        assert (await frame(data=b"\x00\x01"))["error"] == "invalid_json"
        huge = json.dumps({"type": "tool_confirm", "approval_id": mine, "reason": "x" * 20000})
        assert (await frame(huge))["error"] == "too_large"
        assert (await frame('{"type": "subscribe"}'))["error"] == "unknown_type"
        cases = [
            ({"decision": "allow"}, "missing_field"),
            ({"approval_id": 5, "decision": "allow"}, "invalid_field"),
            ({"approval_id": mine, "decision": "maybe"}, "invalid_decision"),
            ({"approval_id": mine, "decision": "allow", "remember": "forever"}, "invalid_field"),
            ({"approval_id": "no-such-id", "decision": "allow"}, "not_found"),
            ({"approval_id": theirs, "decision": "allow"}, "not_found"),
            ({"approval_id": mine, "decision": "allow", "session_id": "s2"}, "not_found"),
        ]
        for fields, code in cases:
            result = await confirm(comm, **fields)
            assert (result["resolved"], result["error"]) == (False, code), fields
            assert result["detail"]
        # Nothing above changed anything; the socket still decides.
        assert (await confirm(comm, approval_id=mine, decision="allow"))["resolved"]
        again = await confirm(comm, approval_id=mine, decision="deny")
        assert (again["error"], again["status"]) == ("already_decided", "allowed")
        await comm.disconnect()

    run(scenario())
    assert Approval.objects.filter(status=Status.PENDING).count() == 1  # bob's


def test_expired_and_abandoned_calls_report_already_decided_with_their_status(users):
    alice, cookie = users["alice"]

    async def scenario():
        comm = await ws(cookie)
        await snapshot_of(comm)
        late, _ = await agate(user=alice, timeout=0.05)
        gone, _ = await agate(user=alice)
        await asyncio.sleep(0.1)
        await sync_to_async(decisions.decide)(gone, Status.ABANDONED, via=Via.SWEEP)
        result = await confirm(comm, approval_id=late, decision="allow")
        assert (result["error"], result["status"]) == ("already_decided", "expired")
        result = await confirm(comm, approval_id=gone, decision="allow")
        assert (result["error"], result["status"]) == ("already_decided", "abandoned")
        await comm.disconnect()

    run(scenario())


def test_many_sockets_all_get_each_event_once(users):
    alice, cookie = users["alice"]

    async def scenario():
        socks = [await ws(cookie) for _ in range(20)]
        for comm in socks:
            await snapshot_of(comm)
        aid, _ = await agate(user=alice)
        t0 = time.perf_counter()
        for comm in socks:
            assert (await next_of(comm, "tool_start"))["approval_id"] == aid
        assert time.perf_counter() - t0 < 2
        for comm in socks:
            assert await comm.receive_nothing(timeout=0.05)
            await comm.disconnect()

    run(scenario())


def test_events_from_other_processes_may_carry_the_user_as_a_string(users):
    """A UUID primary key cannot travel through the layer as is: it is sent as a string."""
    from approvals.channellink import wire as _wire

    key = uuid.uuid4()
    wired = _wire({"type": "tool_start", "approval_id": "x", "_user_id": key})
    assert json.loads(json.dumps(wired))["_user_id"] == str(key)
    alice, cookie = users["alice"]
    _, bob_cookie = users["bob"]

    async def scenario():
        mine, other = await ws(cookie), await ws(bob_cookie)
        await snapshot_of(mine)
        await snapshot_of(other)
        event = {
            "type": "tool_decision",
            "approval_id": "remote-1",
            "session_id": "s1",
            "status": "denied",
            "decided_via": "api",
            "decided_by": None,
            "reason": "",
            "_user_id": str(alice.pk),
        }
        get_listener().deliver(event)
        assert (await next_of(mine, "tool_decision"))["approval_id"] == "remote-1"
        assert await other.receive_nothing(timeout=0.2)
        await mine.disconnect()
        await other.disconnect()

    run(scenario())
