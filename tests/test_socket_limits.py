"""Sockets follow their user's current state, stay bounded, and never stall one another."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth.models import Permission
from django.contrib.sessions.models import Session
from django.db import connection
from django.test import Client, override_settings

from approvals import gate, hub
from approvals.models import Approval

from .test_consumer import agate, confirm, next_of, run, snapshot_of, ws
from .test_consumer import users as users  # noqa: F401  (the fixture)

pytestmark = pytest.mark.django_db(transaction=True)
FAST = {"SOCKET_RECHECK_SECONDS": 0.2}


async def closed_with(comm, timeout: float = 5) -> int | None:
    """The close code the socket gets, skipping messages met on the way."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        output = await comm.receive_output(timeout=deadline - time.monotonic())
        if output["type"] == "websocket.close":
            return output.get("code")
    return None


@override_settings(APPROVALS=FAST)
@pytest.mark.parametrize("how", ["deactivated", "session_deleted"])
def test_a_socket_of_a_deactivated_or_signed_out_user_is_closed(users, how):
    alice, cookie = users["alice"]

    async def scenario():
        comm = await ws(cookie)
        await snapshot_of(comm)
        if how == "deactivated":
            await sync_to_async(type(alice).objects.filter(pk=alice.pk).update)(is_active=False)
        else:
            await sync_to_async(Session.objects.filter(session_key=cookie).delete)()
        await agate(user=alice)  # gated after: must not reach the socket
        code = await closed_with(comm)
        return code

    assert run(scenario()) == hub.CLOSE_SIGNED_OUT


def test_tool_confirm_checks_the_user_as_they_are_now(users):
    alice, cookie = users["alice"]

    async def scenario():
        comm = await ws(cookie)
        await snapshot_of(comm)
        aid, _ = await agate(user=alice)
        await sync_to_async(type(alice).objects.filter(pk=alice.pk).update)(is_active=False)
        reply = await confirm(comm, approval_id=aid, decision="allow")
        return aid, reply

    aid, reply = run(scenario())
    assert (reply["resolved"], reply["error"]) == (False, "authentication_required")
    assert Approval.objects.get(approval_id=aid).status == "pending"


@override_settings(APPROVALS=FAST)
def test_a_decider_who_loses_the_permission_sees_only_their_own_calls(users):
    boss, cookie = users["boss"]
    alice, _ = users["alice"]

    async def scenario():
        comm = await ws(cookie)
        await snapshot_of(comm)
        perm = await sync_to_async(Permission.objects.get)(codename="decide_approval")
        await sync_to_async(boss.user_permissions.remove)(perm)
        # The next re-check (every 0.2 s here) narrows the socket; under load it
        # may take longer, so wait for it rather than for a fixed time.
        wide = hub._hubs[asyncio.get_running_loop()].everyone
        deadline = time.monotonic() + 15
        while wide and time.monotonic() < deadline:  # noqa: ASYNC110 (the hub's set)
            await asyncio.sleep(0.05)
        assert not wide, "the socket was never narrowed"
        await agate(user=alice)
        own, _ = await agate(user=boss)
        event = await next_of(comm, "tool_start")
        reply = await confirm(comm, approval_id=own, decision="deny")
        return own, event, reply

    own, event, reply = run(scenario())
    assert event["approval_id"] == own
    assert reply["resolved"] is True


@override_settings(APPROVALS={"SOCKET_QUEUE_LIMIT": 5})
def test_a_socket_that_falls_behind_is_closed_with_a_bounded_queue(users):
    alice, cookie = users["alice"]

    async def scenario():
        comm = await ws(cookie)
        await snapshot_of(comm)
        [queue] = [q for q in hub._hubs[asyncio.get_running_loop()].queues]
        sizes = []
        original = queue.socket.send

        async def stuck(*args, **kwargs):  # a client that never takes a frame
            await asyncio.sleep(3600)

        queue.socket.send = stuck
        for _ in range(20):
            await agate(user=alice)
            sizes.append(queue.qsize())
        code = await closed_with(comm)
        queue.socket.send = original
        return sizes, code, queue

    sizes, code, queue = run(scenario())
    assert max(sizes) <= 5
    assert code == hub.CLOSE_TOO_SLOW
    assert queue.dropped
    assert queue.empty()  # its events are let go at once, not left for the cyclic collector


@override_settings(APPROVALS={"MAX_SOCKETS_PER_USER": 2})
def test_a_user_may_open_only_so_many_sockets(users):
    _, cookie = users["alice"]

    async def scenario():
        first, second = await ws(cookie), await ws(cookie)
        comm = await ws(cookie)
        code = await closed_with(comm)
        for c in (first, second):
            await c.disconnect()
        return code

    assert run(scenario()) == 4429


@override_settings(APPROVALS={"SNAPSHOT_MAX_BYTES": 40_000})
def test_the_snapshot_is_capped_by_bytes_and_says_how_many_more(users):
    alice, cookie = users["alice"]

    async def scenario():
        for _ in range(6):
            await agate(user=alice, arguments={"blob": "x" * 10_000})
        comm = await ws(cookie)
        message = await comm.receive_json_from(timeout=5)
        await comm.disconnect()
        return message

    message = run(scenario())
    assert len(message["pending"]) == 3 and message["more"] == 3


def test_arguments_over_the_limit_are_refused_by_the_gate():
    limit = override_settings(APPROVALS={"MAX_ARGUMENTS_BYTES": 1000})
    with limit, pytest.raises(ValueError, match="MAX_ARGUMENTS_BYTES"):
        gate.begin_tool_decision("s", gate.new_approval_id(), arguments={"x": "y" * 2000})
    for bad in ({"x": "\ud800"}, {"x": "a\x00b"}):
        with pytest.raises(ValueError):
            gate.begin_tool_decision("s", gate.new_approval_id(), arguments=bad)


@pytest.mark.skipif(connection.vendor != "sqlite", reason="locks the SQLite file")
def test_a_locked_database_does_not_stall_other_sockets(users):
    """A writer holds the SQLite file; a read-only confirm and a new connect still answer."""
    _, bob_cookie = users["bob"]
    _, alice_cookie = users["alice"]
    name = settings.DATABASES["default"]["TEST"].get("NAME") or connection.settings_dict["NAME"]

    async def scenario():
        bob = await ws(bob_cookie)
        await snapshot_of(bob)
        locker = sqlite3.connect(connection.settings_dict["NAME"] or name, timeout=1)
        locker.isolation_level = None
        locker.execute("BEGIN IMMEDIATE")
        try:
            started = time.monotonic()
            reply = await confirm(bob, approval_id=gate.new_approval_id(), decision="allow")
            answered = time.monotonic() - started
            alice = await ws(alice_cookie)
            await snapshot_of(alice)
            connected = time.monotonic() - started
        finally:
            locker.execute("ROLLBACK")
            locker.close()
        return reply, answered, connected

    reply, answered, connected = run(scenario())
    assert reply["error"] == "not_found"
    assert answered < 5 and connected < 10


@pytest.mark.skipif(connection.vendor != "sqlite", reason="locks the SQLite file")
@pytest.mark.parametrize("threads", ["pool", "one"])
def test_a_confirm_waiting_for_the_write_lock_does_not_hold_up_other_users(
    users, monkeypatch, threads
):
    """Alice's allow waits seconds for a write lock held outside; Bob's read-only confirm
    and a new socket's snapshot answer first. With one thread for every socket's database
    work (Channels' ``database_sync_to_async``, as before), they queue behind her: the
    ``"one"`` case shows the scenario does stall a single thread."""
    from concurrent.futures import ThreadPoolExecutor

    alice, alice_cookie = users["alice"]
    _, bob_cookie = users["bob"]
    if threads == "one":
        monkeypatch.setattr(hub, "_executor", ThreadPoolExecutor(1))
    done: dict[str, float] = {}

    async def timed(name, coro):
        result = await coro
        done[name] = time.monotonic()
        return result

    async def new_socket():
        comm = await ws(bob_cookie)
        return await snapshot_of(comm)

    async def decide(comm, **fields):
        await comm.send_json_to({"type": "tool_confirm", **fields})
        return await next_of(comm, "tool_confirm_result", timeout=15)

    async def scenario():
        aid, _ = await agate(user=alice)
        a, b = await ws(alice_cookie), await ws(bob_cookie)
        await snapshot_of(a)
        await snapshot_of(b)
        locker = sqlite3.connect(connection.settings_dict["NAME"], timeout=1)
        locker.isolation_level = None
        locker.execute("BEGIN IMMEDIATE")
        asyncio.get_running_loop().call_later(3, locker.execute, "ROLLBACK")
        try:
            writer = asyncio.ensure_future(
                timed("alice", decide(a, approval_id=aid, decision="allow"))
            )
            await asyncio.sleep(0.5)  # her decision is waiting for the lock now
            reader = timed("bob", decide(b, approval_id=gate.new_approval_id(), decision="deny"))
            results = await asyncio.gather(writer, reader, timed("connect", new_socket()))
        finally:
            await asyncio.sleep(0)  # the rollback, if not yet run
            locker.close()
        return aid, results

    aid, (mine, theirs, snapshot) = run(scenario())
    assert mine["resolved"] is True and theirs["error"] == "not_found" and snapshot == []
    assert Approval.objects.get(approval_id=aid).status == "allowed"
    if threads == "pool":
        assert done["bob"] < done["alice"] and done["connect"] < done["alice"], done
    else:
        assert done["bob"] > done["alice"] and done["connect"] > done["alice"], done


@override_settings(
    APPROVALS={
        "MAX_ARGUMENTS_BYTES": 4 * 2**20,
        "PREVIEW_BYTES": 2**30,
        "SNAPSHOT_MAX_BYTES": 2**30,
    }
)
def test_no_frame_exceeds_the_servers_limit_whatever_the_settings(users):
    """Settings that allow 1.2 MB arguments and ask for previews and snapshots of a
    gigabyte still send frames under daphne's 1 MiB."""
    alice, cookie = users["alice"]

    async def scenario():
        await agate(user=alice, arguments={"blob": "x" * 1_200_000})
        comm = await ws(cookie)
        snapshot = await comm.receive_from(timeout=5)
        await agate(user=alice, arguments={"blob": "y" * 1_200_000})
        start = await comm.receive_from(timeout=5)
        await comm.disconnect()
        return snapshot, start

    snapshot, start = run(scenario())
    assert len(snapshot.encode()) < 2**20 and len(start.encode()) < 2**20
    [item] = json.loads(snapshot)["pending"]
    assert item["arguments_truncated"] is True and item["arguments"].startswith('{"blob":"xxx')
    assert json.loads(start)["arguments_truncated"] is True


@override_settings(APPROVALS={"PREVIEW_BYTES": 1000})
def test_large_arguments_are_previewed_on_the_socket_and_whole_over_http(users):
    alice, cookie = users["alice"]
    bob, _ = users["bob"]
    blob = {"text": "é" * 3000}

    async def scenario():
        small, _ = await agate(user=alice, arguments={"cmd": "ls"})
        big, _ = await agate(user=alice, arguments=blob)
        comm = await ws(cookie)
        items = {item["approval_id"]: item for item in await snapshot_of(comm)}
        live, _ = await agate(user=alice, arguments=blob)
        event = await next_of(comm, "tool_start")
        await comm.disconnect()
        return small, big, items, event

    small, big, items, event = run(scenario())
    assert items[small]["arguments"] == {"cmd": "ls"} and "arguments_truncated" not in items[small]
    for item in (items[big], event):
        assert item["arguments_truncated"] is True
        assert item["arguments"].startswith('{"text":"éé')
        assert len(item["arguments"].encode()) <= 1000
    me, other = Client(), Client()
    me.force_login(alice)
    other.force_login(bob)
    whole = me.get(f"/api/inference/tool-approvals/{big}")
    assert whole.status_code == 200
    assert whole.json()["arguments"] == blob and whole.json()["status"] == "pending"
    for client, aid in ((other, big), (me, gate.new_approval_id()), (me, "a\x00b")):
        answer = client.get(f"/api/inference/tool-approvals/{aid}")
        assert (answer.status_code, answer.json()["error"]) == (404, "not_found")
    assert Client().get(f"/api/inference/tool-approvals/{big}").status_code == 401


def test_a_huge_arguments_schema_is_refused_by_the_gate():
    schema = {"description": "d" * 70_000}
    with pytest.raises(ValueError, match="arguments_schema"):
        gate.begin_tool_decision(
            "s", gate.new_approval_id(), editable=True, arguments_schema=schema
        )
