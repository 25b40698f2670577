"""The async twins against a real daphne of this project (realserver.py)."""

from __future__ import annotations

import threading
from typing import Any

import anyio
import pytest
from realserver import ToolgateServer
from toolgate_client import (
    ApprovalIdInUse,
    AuthenticationError,
    Decision,
    ToolgateClient,
    new_approval_id,
)

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def pending(server: ToolgateServer, count: int = 1) -> list[Any]:
    with anyio.fail_after(30):
        while True:
            # A quick synchronous look (no worker thread: the tests count threads).
            calls = [c for c in server.calls.values() if c.status == "pending"]
            if len(calls) >= count:
                return calls
            await anyio.sleep(0.02)


class Asker:
    """Runs one arequest_tool_decision in a task group and keeps its outcome."""

    def __init__(self) -> None:
        self.decision: Decision | None = None

    async def __call__(self, client: ToolgateClient, **kwargs: Any) -> None:
        self.decision = await client.arequest_tool_decision("s1", "write_file", **kwargs)


async def test_allow_and_deny(client: ToolgateClient, server: ToolgateServer) -> None:
    allow, deny = Asker(), Asker()
    with anyio.fail_after(45):
        async with anyio.create_task_group() as tg:
            tg.start_soon(allow, client)
            tg.start_soon(deny, client)
            first, second = await pending(server, 2)
            server.decide(first.approval_id, "allow")
            server.decide(second.approval_id, "deny", reason="no")
    outcomes = sorted([allow.decision.status, deny.decision.status])  # type: ignore[union-attr]
    assert outcomes == ["allowed", "denied"]
    await client.aclose()


async def test_edit(client: ToolgateClient, server: ToolgateServer) -> None:
    edit = Asker()
    with anyio.fail_after(45):
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: edit(client, arguments={"p": 1}, editable=True))
            (call,) = await pending(server)
            assert call.editable
            assert server.decide(call.approval_id, "allow", arguments={"p": 2})
    assert edit.decision and edit.decision.allowed and edit.decision.arguments == {"p": 2}
    await client.aclose()


async def test_waiting_holds_no_thread(client: ToolgateClient, server: ToolgateServer) -> None:
    askers = [Asker() for _ in range(20)]
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            before = threading.active_count()
            for asker in askers:
                tg.start_soon(asker, client)
            calls = await pending(server, 20)
            await anyio.sleep(1.5)  # through at least one long-poll round
            assert threading.active_count() <= before
            for call in calls:
                server.decide(call.approval_id, "allow")
    assert all(a.decision and a.decision.allowed for a in askers)
    await client.aclose()


async def test_restart_and_5xx_keep_the_same_call(
    client: ToolgateClient, server: ToolgateServer
) -> None:
    asker = Asker()
    server.fail_next(2, 503, "/approvals")
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(asker, client)
            (call,) = await pending(server)
            await anyio.to_thread.run_sync(server.stop)
            await anyio.sleep(0.5)
            await anyio.to_thread.run_sync(server.start)
            server.fail_next(1, 500, call.approval_id)
            await anyio.sleep(0.3)
            server.decide(call.approval_id, "allow")
    assert asker.decision and asker.decision.allowed
    assert asker.decision.approval_id == call.approval_id
    assert len(server.calls) == 1
    posts = [s for m, p, s in server.requests if m == "POST"]
    # Two refused, then through. Under load the restart can also catch a POST whose
    # answer had not arrived yet: it is sent again, and still makes no second call.
    assert posts[:2] == [503, 503] and posts[2:] and set(posts[2:]) == {0}, posts
    await client.aclose()


async def test_cancelling_the_task_cancels_the_call(
    client: ToolgateClient, server: ToolgateServer
) -> None:
    approval_id = new_approval_id()
    with anyio.fail_after(45):
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: client.arequest_tool_decision("s1", "t", approval_id=approval_id))
            await pending(server)
            tg.cancel_scope.cancel()
    assert server.calls[approval_id].status == "cancelled"
    await client.aclose()


async def test_asyncio_wait_for_timeout_cancels_the_call(
    client: ToolgateClient, server: ToolgateServer
) -> None:
    import asyncio

    approval_id = new_approval_id()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(
            client.arequest_tool_decision("s1", "t", approval_id=approval_id), 0.5
        )
    assert server.calls[approval_id].status == "cancelled"
    await client.aclose()


async def test_acancel_and_amark_executed(client: ToolgateClient, server: ToolgateServer) -> None:
    first, second = new_approval_id(), new_approval_id()
    results: dict[str, Decision] = {}

    async def ask(approval_id: str) -> None:
        results[approval_id] = await client.arequest_tool_decision(
            "s1", "t", approval_id=approval_id
        )

    with anyio.fail_after(45):
        async with anyio.create_task_group() as tg:
            tg.start_soon(ask, first)
            tg.start_soon(ask, second)
            await pending(server, 2)
            assert await client.acancel(first) is True
            assert await client.acancel(first) is False
            server.decide(second, "allow")
    assert results[first].status == "cancelled"
    assert await client.amark_executed(second, summary="ok") is True
    assert await client.amark_executed(second) is False
    assert server.calls[second].execution_summary == "ok"
    await client.aclose()


async def test_async_errors(server: ToolgateServer) -> None:
    async with ToolgateClient(server.url, "wrong") as tg:
        with pytest.raises(AuthenticationError):
            await tg.arequest_tool_decision("s1", "t")
    approval_id = new_approval_id()
    alice = ToolgateClient(server.url, server.keys["alice"], wait=1)
    bob = ToolgateClient(server.url, server.keys["bob"])
    async with alice, bob, anyio.create_task_group() as tg:
        tg.start_soon(lambda: alice.arequest_tool_decision("s1", "t", approval_id=approval_id))
        await pending(server)
        with pytest.raises(ApprovalIdInUse):
            await bob.arequest_tool_decision("s1", "t", approval_id=approval_id)
        server.decide(approval_id, "deny")
