"""The async twins against the stand-in over real sockets."""

from __future__ import annotations

import threading
from typing import Any

import anyio
import pytest
from standin import StandinServer
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


async def pending(standin: StandinServer, count: int = 1) -> list[Any]:
    with anyio.fail_after(10):
        while True:
            calls = [c for c in list(standin.calls.values()) if c.status == "pending"]
            if len(calls) >= count:
                return calls
            await anyio.sleep(0.02)


class Asker:
    """Runs one arequest_tool_decision in a task group and keeps its outcome."""

    def __init__(self) -> None:
        self.decision: Decision | None = None

    async def __call__(self, client: ToolgateClient, **kwargs: Any) -> None:
        self.decision = await client.arequest_tool_decision("s1", "write_file", **kwargs)


async def test_allow_deny_edit(client: ToolgateClient, standin: StandinServer) -> None:
    allow, deny, edit = Asker(), Asker(), Asker()
    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg:
            tg.start_soon(allow, client)
            tg.start_soon(deny, client)
            tg.start_soon(lambda: edit(client, arguments={"p": 1}, editable=True))
            calls = await pending(standin, 3)
            (edited,) = [c for c in calls if c.editable]
            first, second = [c for c in calls if not c.editable]
            standin.decide(edited.approval_id, "allow", arguments={"p": 2})
            standin.decide(first.approval_id, "allow")
            standin.decide(second.approval_id, "deny", reason="no")
    assert edit.decision and edit.decision.allowed and edit.decision.arguments == {"p": 2}
    outcomes = sorted([allow.decision.status, deny.decision.status])  # type: ignore[union-attr]
    assert outcomes == ["allowed", "denied"]
    await client.aclose()


async def test_waiting_holds_no_thread(client: ToolgateClient, standin: StandinServer) -> None:
    askers = [Asker() for _ in range(20)]
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            before = threading.active_count()
            for asker in askers:
                tg.start_soon(asker, client)
            calls = await pending(standin, 20)
            await anyio.sleep(1.5)  # through at least one long-poll round
            assert threading.active_count() <= before
            for call in calls:
                standin.decide(call.approval_id, "allow")
    assert all(a.decision and a.decision.allowed for a in askers)
    await client.aclose()


async def test_restart_and_5xx_keep_the_same_call(
    client: ToolgateClient, standin: StandinServer
) -> None:
    asker = Asker()
    standin.fail_next(2, 503, "/approvals")
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(asker, client)
            (call,) = await pending(standin)
            await anyio.to_thread.run_sync(standin.stop)
            await anyio.sleep(0.5)
            await anyio.to_thread.run_sync(standin.start)
            standin.fail_next(1, 500, call.approval_id)
            await anyio.sleep(0.3)
            standin.decide(call.approval_id, "allow")
    assert asker.decision and asker.decision.allowed
    assert asker.decision.approval_id == call.approval_id
    assert len(standin.calls) == 1
    assert [s for m, p, s in standin.requests if m == "POST"] == [503, 503, 0]
    await client.aclose()


async def test_cancelling_the_task_cancels_the_call(
    client: ToolgateClient, standin: StandinServer
) -> None:
    approval_id = new_approval_id()
    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: client.arequest_tool_decision("s1", "t", approval_id=approval_id))
            await pending(standin)
            tg.cancel_scope.cancel()
    assert standin.calls[approval_id].status == "cancelled"
    await client.aclose()


async def test_asyncio_wait_for_timeout_cancels_the_call(
    client: ToolgateClient, standin: StandinServer
) -> None:
    import asyncio

    approval_id = new_approval_id()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(
            client.arequest_tool_decision("s1", "t", approval_id=approval_id), 0.5
        )
    assert standin.calls[approval_id].status == "cancelled"
    await client.aclose()


async def test_acancel_and_amark_executed(client: ToolgateClient, standin: StandinServer) -> None:
    first, second = new_approval_id(), new_approval_id()
    results: dict[str, Decision] = {}

    async def ask(approval_id: str) -> None:
        results[approval_id] = await client.arequest_tool_decision(
            "s1", "t", approval_id=approval_id
        )

    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg:
            tg.start_soon(ask, first)
            tg.start_soon(ask, second)
            await pending(standin, 2)
            assert await client.acancel(first) is True
            assert await client.acancel(first) is False
            standin.decide(second, "allow")
    assert results[first].status == "cancelled"
    assert await client.amark_executed(second, summary="ok") is True
    assert await client.amark_executed(second) is False
    assert standin.calls[second].execution_summary == "ok"
    await client.aclose()


async def test_async_errors(standin: StandinServer) -> None:
    async with ToolgateClient(standin.url, "wrong") as tg:
        with pytest.raises(AuthenticationError):
            await tg.arequest_tool_decision("s1", "t")
    approval_id = new_approval_id()
    alice = ToolgateClient(standin.url, "key-alice", wait=1)
    bob = ToolgateClient(standin.url, "key-bob")
    async with alice, bob, anyio.create_task_group() as tg:
        tg.start_soon(lambda: alice.arequest_tool_decision("s1", "t", approval_id=approval_id))
        await pending(standin)
        with pytest.raises(ApprovalIdInUse):
            await bob.arequest_tool_decision("s1", "t", approval_id=approval_id)
        standin.decide(approval_id, "deny")
