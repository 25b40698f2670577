"""toolgate-mcp-proxy end to end: the SDK's own client -> the proxy -> a real MCP server.

The proxy runs as a subprocess (`python -m toolgate_client.mcp_proxy`), exactly as an MCP
client would launch it, and gates against a real daphne of this project (realserver.py).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("mcp")

import mcp_types as types  # noqa: E402
import upstream_server  # noqa: E402
import uvicorn  # noqa: E402
from mcp.client.session import ClientSession  # noqa: E402
from mcp.client.stdio import StdioServerParameters, stdio_client  # noqa: E402
from realserver import DENIED, ToolgateServer  # noqa: E402

pytestmark = pytest.mark.anyio
HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
UPSTREAM = [sys.executable, str(HERE / "upstream_server.py")]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def log(tmp_path: Path) -> Path:
    return tmp_path / "executions.jsonl"


def executions(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]


@asynccontextmanager
async def proxied(
    server: ToolgateServer, log: Path, *flags: str, upstream: list[str] | None = None
) -> AsyncIterator[ClientSession]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), str(HERE), env.get("PYTHONPATH", "")])
    env["UPSTREAM_LOG"] = str(log)
    env["TOOLGATE_KEY"] = server.keys["alice"]
    command = ["--url", server.url, "--progress-interval", "0.3", *flags]
    if upstream is None:
        command += ["--", *UPSTREAM]
    else:
        command += upstream
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "toolgate_client.mcp_proxy", *command], env=env
    )
    async with (
        stdio_client(params) as (read, write),
        ClientSession(
            read, write, client_info=types.Implementation(name="test client", version="1")
        ) as session,
    ):
        with anyio.fail_after(60):
            await session.initialize()
        yield session


async def pending(server: ToolgateServer, count: int = 1) -> list[Any]:
    with anyio.fail_after(30):
        while True:
            # A quick synchronous look (no worker thread: the tests count threads).
            calls = [c for c in server.calls.values() if c.status == "pending"]
            if len(calls) >= count:
                return calls
            await anyio.sleep(0.02)


async def until(predicate: Any, timeout: float = 10) -> None:
    # The server's state changes in another process: there is no event to await here.
    with anyio.fail_after(timeout):
        while not predicate():  # noqa: ASYNC110
            await anyio.sleep(0.02)


class Caller:
    def __init__(self, session: ClientSession, name: str, arguments: dict[str, Any]) -> None:
        self.session, self.name, self.arguments = session, name, arguments
        self.result: types.CallToolResult | None = None
        self.progress: list[tuple[float, float | None, str | None]] = []

    async def __call__(self, with_progress: bool = False) -> None:
        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            self.progress.append((progress, total, message))

        self.result = await self.session.call_tool(
            self.name, self.arguments, progress_callback=on_progress if with_progress else None
        )


def text(result: types.CallToolResult | None) -> str:
    assert result is not None
    return " ".join(b.text for b in result.content if isinstance(b, types.TextContent))


async def test_passes_through_unchanged(server: ToolgateServer, log: Path) -> None:
    direct = StdioServerParameters(
        command=UPSTREAM[0], args=UPSTREAM[1:], env={**os.environ, "UPSTREAM_LOG": str(log)}
    )
    async with stdio_client(direct) as (read, write), ClientSession(read, write) as upstream:
        init = await upstream.initialize()
        tools = await upstream.list_tools()
    async with proxied(server, log) as session:
        mirrored = session.initialize_result
        assert mirrored is not None
        assert mirrored.server_info.name == init.server_info.name == "notes-upstream"
        assert mirrored.server_info.version == "1.2.3"
        assert mirrored.instructions == "Keeps notes."
        assert mirrored.capabilities.tools and mirrored.capabilities.resources
        assert mirrored.capabilities.prompts and mirrored.capabilities.logging is None
        assert (await session.list_tools()) == tools
        resources = await session.list_resources()
        assert [str(r.uri) for r in resources.resources] == ["notes://readme"]
        read = await session.read_resource("notes://readme")
        assert read.contents[0].text == "A notebook."  # type: ignore[union-attr]
        prompt = await session.get_prompt("summarize", {"topic": "cats"})
        assert "cats" in prompt.messages[0].content.text  # type: ignore[union-attr]
    assert server.calls == {} and executions(log) == []


async def test_runs_only_after_allow(server: ToolgateServer, log: Path) -> None:
    async with proxied(server, log) as session, anyio.create_task_group() as tg:
        caller = Caller(session, "write_note", {"text": "hello"})
        tg.start_soon(caller)
        (call,) = await pending(server)
        assert call.tool_name == "write_note" and call.arguments == {"text": "hello"}
        assert call.description == "Append a note to the notebook."
        assert call.editable and call.arguments_schema
        assert call.arguments_schema["properties"]["text"]["type"] == "string"
        assert call.session_id.startswith("mcp-test-client-")
        await anyio.sleep(0.3)
        assert executions(log) == [] and caller.result is None
        server.decide(call.approval_id, "allow")
    assert text(caller.result) == "saved: hello" and not caller.result.is_error  # type: ignore[union-attr]
    assert executions(log) == [{"tool": "write_note", "text": "hello", "tag": ""}]
    await until(lambda: server.calls[call.approval_id].executed_at is not None)
    assert server.calls[call.approval_id].execution_ok is True


async def test_denied_never_runs(server: ToolgateServer, log: Path) -> None:
    async with proxied(server, log, "--session-id", "my-session") as session:
        async with anyio.create_task_group() as tg:
            caller = Caller(session, "write_note", {"text": "rm -rf"})
            tg.start_soon(caller)
            (call,) = await pending(server)
            assert call.session_id == "my-session"
            server.decide(call.approval_id, "deny", reason="too risky")
        assert caller.result is not None and caller.result.is_error
        assert text(caller.result) == f"{DENIED} Reason: too risky"
    assert executions(log) == []


async def test_edited_call_runs_with_the_edit(server: ToolgateServer, log: Path) -> None:
    async with proxied(server, log) as session, anyio.create_task_group() as tg:
        caller = Caller(session, "write_note", {"text": "draft"})
        tg.start_soon(caller)
        (call,) = await pending(server)
        server.decide(call.approval_id, "allow", arguments={"text": "final", "tag": "x"})
    assert text(caller.result) == "saved: final"
    assert executions(log) == [{"tool": "write_note", "text": "final", "tag": "x"}]


async def test_read_only_tools(server: ToolgateServer, log: Path) -> None:
    async with proxied(server, log, "--allow-read-only") as session:
        result = await session.call_tool("read_notes", {})
        assert text(result) == "no notes yet" and server.calls == {}
    async with proxied(server, log) as session, anyio.create_task_group() as tg:
        caller = Caller(session, "read_notes", {})
        tg.start_soon(caller)
        (call,) = await pending(server)
        assert call.tool_name == "read_notes"
        server.decide(call.approval_id, "allow")
    assert [e["tool"] for e in executions(log)] == ["read_notes", "read_notes"]


async def test_cancelled_request_cancels_the_approval(server: ToolgateServer, log: Path) -> None:
    async with proxied(server, log) as session:
        async with anyio.create_task_group() as tg:
            tg.start_soon(Caller(session, "write_note", {"text": "never"}))
            (call,) = await pending(server)
            tg.cancel_scope.cancel()  # the SDK sends notifications/cancelled
        await until(lambda: server.calls[call.approval_id].status == "cancelled")
        assert server.calls[call.approval_id].decided_via == "cancel"
        # The proxy keeps serving after a cancellation.
        assert len((await session.list_tools()).tools) == 4
    assert executions(log) == []


async def test_progress_while_waiting(server: ToolgateServer, log: Path) -> None:
    async with proxied(server, log) as session, anyio.create_task_group() as tg:
        caller = Caller(session, "count", {})
        tg.start_soon(caller, True)
        (call,) = await pending(server)
        await until(lambda: len(caller.progress) >= 2)
        assert "Waiting for a person" in (caller.progress[0][2] or "")
        server.decide(call.approval_id, "allow")
    assert text(caller.result) == "counted"
    values = [p for p, _, _ in caller.progress]
    assert values == sorted(values) and len(set(values)) == len(values)
    assert [m for *_, m in caller.progress[-3:]] == ["step 1", "step 2", "step 3"]


async def test_no_progress_without_a_token(server: ToolgateServer, log: Path) -> None:
    notes: list[Any] = []

    async with proxied(server, log) as session, anyio.create_task_group() as tg:
        session._message_handler = _collect(notes)  # noqa: SLF001
        caller = Caller(session, "write_note", {"text": "a"})
        tg.start_soon(caller)
        (call,) = await pending(server)
        await anyio.sleep(0.8)
        server.decide(call.approval_id, "allow")
    assert not any(isinstance(n, types.ProgressNotification) for n in notes)


def _collect(into: list[Any]) -> Any:
    async def handler(message: Any) -> None:
        into.append(message)

    return handler


async def test_failing_tool_is_reported(server: ToolgateServer, log: Path) -> None:
    async with proxied(server, log) as session, anyio.create_task_group() as tg:
        caller = Caller(session, "broken", {})
        tg.start_soon(caller)
        (call,) = await pending(server)
        server.decide(call.approval_id, "allow")
    assert caller.result is not None and caller.result.is_error
    await until(lambda: server.calls[call.approval_id].executed_at is not None)
    row = server.calls[call.approval_id]
    assert row.execution_ok is False and "broken" in row.execution_summary


@pytest.fixture
def http_upstream(log: Path) -> Iterator[str]:
    app = upstream_server.build(log).streamable_http_app()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}/mcp"
    server.should_exit = True
    thread.join(10)


async def test_streamable_http_upstream(
    server: ToolgateServer, log: Path, http_upstream: str
) -> None:
    upstream = ["--upstream-url", http_upstream]
    async with proxied(server, log, upstream=upstream) as session:
        assert len((await session.list_tools()).tools) == 4
        async with anyio.create_task_group() as tg:
            caller = Caller(session, "write_note", {"text": "over http"})
            tg.start_soon(caller)
            (call,) = await pending(server)
            server.decide(call.approval_id, "allow")
        assert text(caller.result) == "saved: over http"
        async with anyio.create_task_group() as tg:
            caller = Caller(session, "write_note", {"text": "no"})
            tg.start_soon(caller)
            (call,) = await pending(server)
            server.decide(call.approval_id, "deny")
        assert caller.result is not None and caller.result.is_error
    assert executions(log) == [{"tool": "write_note", "text": "over http", "tag": ""}]
