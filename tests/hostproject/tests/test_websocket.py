"""The consumer inside the host's own router, at ``/realtime/gate/approvals/``."""

from __future__ import annotations

import asyncio
import threading

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import Client

from approvals import gate
from approvals.models import Approval

pytestmark = pytest.mark.django_db(transaction=True)

PATH = "/realtime/gate/approvals/"


def _application():
    from hostsite.asgi import application  # after pytest-django set ALLOWED_HOSTS

    return application


def _cookie_for(user) -> bytes:
    client = Client()
    client.force_login(user)
    name = settings.SESSION_COOKIE_NAME
    return f"{name}={client.cookies[name].value}".encode()


def _connect(user=None, path=PATH, origin=b"http://testserver"):
    headers = [(b"origin", origin)]
    if user is not None:
        headers.append((b"cookie", _cookie_for(user)))
    return WebsocketCommunicator(_application(), path, headers=headers)


def _run(coro):
    return asyncio.run(asyncio.wait_for(coro, 20))


def test_snapshot_tool_start_and_tool_confirm_at_the_hosts_path(alice):
    old = gate.new_approval_id()
    old_slot = gate.begin_tool_decision("ws-run", old, tool_name="read_file", user=alice)
    communicator = _connect(alice)
    box: dict = {}

    async def scenario():
        connected, _ = await communicator.connect()
        assert connected
        snapshot = await communicator.receive_json_from(5)
        assert snapshot["type"] == "snapshot"
        assert [p["approval_id"] for p in snapshot["pending"]] == [old]

        aid = gate.new_approval_id()
        slot = await database_sync_to_async(gate.begin_tool_decision)(
            "ws-run", aid, tool_name="shell", arguments={"cmd": "make"}, user=alice
        )
        waiter = threading.Thread(
            target=lambda: box.update(answer=gate.wait_tool_decision(slot, aid))
        )
        waiter.start()
        start = await communicator.receive_json_from(5)
        assert start["type"] == "tool_start" and start["approval_id"] == aid
        assert start["awaiting_confirmation"] is True
        assert not any(key.startswith("_") for key in start)

        await communicator.send_json_to(
            {"type": "tool_confirm", "approval_id": aid, "decision": "allow"}
        )
        frames = [await communicator.receive_json_from(5) for _ in range(2)]
        by_type = {frame["type"]: frame for frame in frames}
        assert by_type["tool_confirm_result"]["resolved"] is True
        decision = by_type["tool_decision"]
        assert (decision["approval_id"], decision["status"]) == (aid, "allowed")
        assert decision["decided_via"] == "websocket"
        assert decision["decided_by"] == "alice@example.com"
        await database_sync_to_async(waiter.join)(5)
        await communicator.disconnect()
        return aid

    aid = _run(scenario())
    assert box["answer"] == "allow"
    assert Approval.objects.get(approval_id=aid).decided_by == alice
    gate.abort_tool_decision(old_slot, old)


def test_a_socket_carries_only_its_users_calls(alice, bob):
    communicator = _connect(bob)

    async def scenario():
        assert (await communicator.connect())[0]
        assert (await communicator.receive_json_from(5))["pending"] == []
        hidden = gate.new_approval_id()
        slot = await database_sync_to_async(gate.begin_tool_decision)(
            "alice-run", hidden, tool_name="shell", user=alice
        )
        mine = gate.new_approval_id()
        slot2 = await database_sync_to_async(gate.begin_tool_decision)(
            "bob-run", mine, tool_name="shell", user=bob
        )
        first = await communicator.receive_json_from(5)
        assert first["approval_id"] == mine  # alice's call never reached bob
        await database_sync_to_async(gate.abort_tool_decision)(slot, hidden)
        await database_sync_to_async(gate.abort_tool_decision)(slot2, mine)
        await communicator.disconnect()

    _run(scenario())


def test_anonymous_is_closed_with_4401():
    communicator = _connect(None)

    async def scenario():
        connected, _ = await communicator.connect()
        assert connected  # accepted, then closed: browsers see the code only after a handshake
        closed = await communicator.receive_output(5)
        assert closed == {"type": "websocket.close", "code": 4401}
        await communicator.disconnect()

    _run(scenario())


def test_a_foreign_origin_is_refused(alice):
    communicator = _connect(alice, origin=b"http://evil.example")

    async def scenario():
        connected, _ = await communicator.connect()
        assert not connected

    _run(scenario())


def test_the_hosts_own_routes_still_work():
    communicator = WebsocketCommunicator(
        _application(), "/realtime/echo/", headers=[(b"origin", b"http://testserver")]
    )

    async def scenario():
        assert (await communicator.connect())[0]
        await communicator.send_json_to({"hello": 1})
        assert await communicator.receive_json_from(5) == {"echo": {"hello": 1}}
        await communicator.disconnect()

    _run(scenario())


def test_an_event_from_another_process_reaches_only_its_uuid_users_socket(alice, bob):
    import json
    from datetime import timedelta

    from django.utils import timezone

    from approvals import events
    from approvals.listener import get_listener

    # Over Redis a UUID primary key travels as its string (msgpack has no UUID type).
    now = timezone.now()
    aid = gate.new_approval_id()
    remote = events.tool_start(
        {
            "approval_id": aid,
            "session_id": "remote-run",
            "tool_name": "shell",
            "tool_call_id": "",
            "arguments": {},
            "created_at": now,
            "expires_at": now + timedelta(minutes=5),
            "status": "pending",
            "user_id": str(alice.pk),
        }
    )
    json.dumps(remote)
    sockets = [_connect(alice), _connect(bob)]

    async def scenario():
        for communicator in sockets:
            assert (await communicator.connect())[0]
            assert (await communicator.receive_json_from(5))["type"] == "snapshot"
        get_listener().deliver(remote)
        start = await sockets[0].receive_json_from(5)
        assert (start["type"], start["approval_id"]) == ("tool_start", aid)
        assert await sockets[1].receive_nothing(0.5)
        for communicator in sockets:
            await communicator.disconnect()

    _run(scenario())
