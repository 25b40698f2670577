"""A stand-in for toolgate's agent API, for testing the client over real sockets.

It reproduces the contract of the four agent endpoints (CONTRACT.md, "Agents outside
Django: keys and the agent API") and nothing else, so that the tests can later run against
the real server (daphne with `approvals.urls`) by swapping this one module:

- every request carries ``Authorization: Bearer <key>``; none: 401
  ``authentication_required``; an unknown key: 401 ``invalid_key``. A key belongs to a user.
- ``POST approvals`` with ``{"session_id", "tool_name", "arguments"?, "tool_call_id"?,
  "approval_id"?, "timeout"?, "description"?, "editable"?, "arguments_schema"?}``: 201 and
  the approval object; the same approval_id again from the same user and session: 200 and
  the current object; from another user or session: 409 ``approval_id_in_use``; invalid:
  400 with a code. (No rules here: every call is asked.)
- ``GET approvals/<id>?wait=N`` (0..60, else 400 ``invalid_wait``): the object, held open
  until the call is decided or N seconds pass (woken by the decision, no polling); unknown
  or another user's: 404 ``not_found``.
- ``POST approvals/<id>/cancel``: pending -> ``cancelled`` (200); decided: 409
  ``already_decided``; unknown: 404.
- ``POST approvals/<id>/executed`` ``{"ok"?, "summary"?}``: 200; not allowed: 409
  ``not_allowed``; reported before: 409 ``already_executed``; unknown: 404.
- errors are JSON ``{"error": <code>, "detail"?: <sentence>}``.

Test hooks, all callable from the test's thread: `decide`, `fail_next` (answer the next
requests with a 5xx), `stop` / `start` (a restart on the same port keeps the state, as the
real server keeps it in its database), `wait_for_pending`, and `requests` / `queries` (logs).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

DENIED = "The user declined to run this tool call."
EXPIRED = "Nobody decided on this tool call in time, so it did not run."
CANCELLED = "This tool call was cancelled before anyone decided, so it did not run."
ABANDONED = "The agent stopped waiting for this tool call, so it did not run."
MESSAGES = {"expired": EXPIRED, "cancelled": CANCELLED, "abandoned": ABANDONED}


def _now() -> datetime:
    return datetime.now(UTC)


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


@dataclass
class Call:
    approval_id: str
    user: str
    session_id: str
    tool_name: str
    tool_call_id: str
    arguments: dict[str, Any]
    description: str
    editable: bool
    arguments_schema: dict[str, Any] | None
    expires_at: datetime
    created_at: datetime = field(default_factory=_now)
    status: str = "pending"
    decided_via: str = ""
    reason: str = ""
    edited_arguments: dict[str, Any] | None = None
    decided_at: datetime | None = None
    executed_at: datetime | None = None
    execution_ok: bool | None = None
    execution_summary: str = ""

    def as_json(self) -> dict[str, Any]:
        message = None
        if self.status == "denied":
            message = DENIED + (f" Reason: {self.reason}" if self.reason else "")
        elif self.status in MESSAGES:
            message = MESSAGES[self.status]
        return {
            "approval_id": self.approval_id,
            "session_id": self.session_id,
            "tool_name": self.tool_name,
            "tool_call_id": self.tool_call_id,
            "arguments": self.arguments,
            "edited_arguments": self.edited_arguments,
            "description": self.description,
            "editable": self.editable,
            "status": self.status,
            "decision": {"allowed": "allow", "denied": "deny"}.get(self.status),
            "decided_via": self.decided_via,
            "reason": self.reason,
            "message": message,
            "created_at": _iso(self.created_at),
            "expires_at": _iso(self.expires_at),
            "decided_at": _iso(self.decided_at),
            "executed_at": _iso(self.executed_at),
        }


def _error(status: int, code: str, detail: str = "") -> JSONResponse:
    body: dict[str, Any] = {"error": code}
    if detail:
        body["detail"] = detail
    return JSONResponse(body, status_code=status)


class StandinServer:
    """The stand-in on 127.0.0.1, run by uvicorn in a thread of its own."""

    def __init__(self, keys: dict[str, str] | None = None, default_timeout: float = 3600) -> None:
        self.keys = keys if keys is not None else {"key-alice": "alice", "key-bob": "bob"}
        self.default_timeout = default_timeout
        self.calls: dict[str, Call] = {}
        self.requests: list[tuple[str, str, int]] = []
        self.queries: list[str] = []
        self._lock = threading.Lock()
        self._failures: list[tuple[int, str]] = []
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()
        self.port = 0
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.app = Starlette(
            routes=[
                Route("/api/inference/approvals", self._create, methods=["POST"]),
                Route("/api/inference/approvals/{approval_id}", self._get, methods=["GET"]),
                Route(
                    "/api/inference/approvals/{approval_id}/cancel",
                    self._cancel,
                    methods=["POST"],
                ),
                Route(
                    "/api/inference/approvals/{approval_id}/executed",
                    self._executed,
                    methods=["POST"],
                ),
            ]
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/inference/"

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        """Serve (again) on `port`; the first start picks a free port."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_level="warning", lifespan="off", access_log=False)
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        self._server, self._thread = server, thread
        thread.start()
        deadline = time.monotonic() + 10
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("the stand-in server did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        """Stop serving, dropping open connections (held long-polls included)."""
        if self._server is None or self._thread is None:
            return
        self._server.should_exit = True
        self._server.force_exit = True
        self._thread.join(10)
        self._server = self._thread = None
        with self._lock:
            self._waiters.clear()

    # -- test hooks ---------------------------------------------------------------------

    def decide(
        self,
        approval_id: str,
        decision: str,
        *,
        reason: str = "",
        arguments: dict[str, Any] | None = None,
        via: str = "web",
    ) -> bool:
        """Decide like a person would; ``True`` only when the call was pending."""
        with self._lock:
            call = self.calls[approval_id]
            if call.status != "pending":
                return False
            call.status = "allowed" if decision == "allow" else "denied"
            call.reason, call.decided_via, call.decided_at = reason, via, _now()
            if arguments is not None:
                call.edited_arguments = arguments
        self._wake()
        return True

    def fail_next(self, count: int, status: int = 503, path: str = "") -> None:
        """Answer the next `count` requests (whose path contains `path`) with `status`."""
        with self._lock:
            self._failures.extend([(status, path)] * count)

    def wait_for_pending(self, timeout: float = 10, count: int = 1) -> list[Call]:
        """Block until at least `count` calls are pending; they are returned oldest first."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                pending = [c for c in self.calls.values() if c.status == "pending"]
            if len(pending) >= count:
                return sorted(pending, key=lambda c: c.created_at)
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(pending)} pending calls after {timeout} s")
            time.sleep(0.02)

    def wait_for_status(self, approval_id: str, status: str, timeout: float = 10) -> Call:
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                call = self.calls.get(approval_id)
                if call is not None and call.status == status:
                    return call
            if time.monotonic() > deadline:
                raise TimeoutError(f"{approval_id} is not {status} after {timeout} s")
            time.sleep(0.02)

    def count(self, method: str, path_part: str = "") -> int:
        with self._lock:
            return sum(1 for m, p, _ in self.requests if m == method and path_part in p)

    # -- the endpoints ------------------------------------------------------------------

    def _wake(self) -> None:
        with self._lock:
            waiters = list(self._waiters)
        for loop, event in waiters:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(event.set)

    async def _prelude(self, request: Request) -> tuple[str | None, JSONResponse | None]:
        """Logs the request, injects failures, authenticates: (user, early answer)."""
        with self._lock:
            failure = next(
                (f for f in self._failures if f[1] in request.url.path),
                None,
            )
            if failure is not None:
                self._failures.remove(failure)
            status = failure[0] if failure else 0
            self.requests.append((request.method, request.url.path, status))
            if request.url.query:
                self.queries.append(request.url.query)
        if failure is not None:
            return None, _error(failure[0], "injected_failure", "Failure injected by the test.")
        header = request.headers.get("authorization", "")
        if not header.startswith("Bearer "):
            return None, _error(401, "authentication_required", "Send an agent key.")
        user = self.keys.get(header.removeprefix("Bearer ").strip())
        if user is None:
            return None, _error(401, "invalid_key", "The key is wrong or revoked.")
        return user, None

    async def _create(self, request: Request) -> JSONResponse:
        user, early = await self._prelude(request)
        if early is not None:
            return early
        assert user is not None
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "invalid_json", "The body is not JSON.")
        if not isinstance(body, dict):
            return _error(400, "invalid_body", "The body must be a JSON object.")
        problem = _invalid_create(body)
        if problem:
            return _error(400, problem[0], problem[1])
        approval_id = body.get("approval_id") or f"srv{time.monotonic_ns()}"
        with self._lock:
            existing = self.calls.get(approval_id)
            if existing is not None:
                if existing.user != user or existing.session_id != body["session_id"]:
                    return _error(409, "approval_id_in_use", "This approval_id is taken.")
                return JSONResponse(self._refresh(existing).as_json(), status_code=200)
            timeout = float(body.get("timeout") or self.default_timeout)
            call = Call(
                approval_id=approval_id,
                user=user,
                session_id=body["session_id"],
                tool_name=body["tool_name"],
                tool_call_id=body.get("tool_call_id") or "",
                arguments=body.get("arguments") or {},
                description=body.get("description") or "",
                editable=bool(body.get("editable")),
                arguments_schema=body.get("arguments_schema"),
                expires_at=_now() + timedelta(seconds=timeout),
            )
            self.calls[approval_id] = call
            return JSONResponse(call.as_json(), status_code=201)

    async def _get(self, request: Request) -> JSONResponse:
        user, early = await self._prelude(request)
        if early is not None:
            return early
        raw_wait = request.query_params.get("wait", "0")
        try:
            wait = float(raw_wait)
        except ValueError:
            wait = -1
        if not 0 <= wait <= 60:
            return _error(400, "invalid_wait", "wait must be a number from 0 to 60.")
        approval_id = request.path_params["approval_id"]
        deadline = time.monotonic() + wait
        event = asyncio.Event()
        entry = (asyncio.get_running_loop(), event)
        with self._lock:
            self._waiters.add(entry)
        try:
            while True:
                with self._lock:
                    call = self.calls.get(approval_id)
                    if call is None or call.user != user:
                        return _error(404, "not_found")
                    self._refresh(call)
                    if call.status != "pending" or time.monotonic() >= deadline:
                        return JSONResponse(call.as_json())
                    event.clear()
                    left = min(
                        deadline - time.monotonic(),
                        (call.expires_at - _now()).total_seconds(),
                    )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), max(0.0, left))
        finally:
            with self._lock:
                self._waiters.discard(entry)

    async def _cancel(self, request: Request) -> JSONResponse:
        return await self._act(request, "cancel")

    async def _executed(self, request: Request) -> JSONResponse:
        return await self._act(request, "executed")

    async def _act(self, request: Request, action: str) -> JSONResponse:
        user, early = await self._prelude(request)
        if early is not None:
            return early
        try:
            body = await request.json() if await request.body() else {}
        except ValueError:
            return _error(400, "invalid_json", "The body is not JSON.")
        with self._lock:
            call = self.calls.get(request.path_params["approval_id"])
            if call is None or call.user != user:
                return _error(404, "not_found")
            self._refresh(call)
            if action == "cancel":
                if call.status != "pending":
                    return _error(409, "already_decided", "The call was decided already.")
                call.status, call.decided_via, call.decided_at = "cancelled", "cancel", _now()
            else:
                if call.status != "allowed":
                    return _error(409, "not_allowed", "The call is not allowed.")
                if call.executed_at is not None:
                    return _error(409, "already_executed", "The call was reported already.")
                call.executed_at = _now()
                call.execution_ok = bool(body.get("ok", True))
                call.execution_summary = str(body.get("summary") or "")
            answer = call.as_json()
        self._wake()
        return JSONResponse(answer)

    def _refresh(self, call: Call) -> Call:
        if call.status == "pending" and _now() >= call.expires_at:
            call.status, call.decided_via, call.decided_at = "expired", "timeout", _now()
        return call


def _invalid_create(body: dict[str, Any]) -> tuple[str, str] | None:
    for name in ("session_id", "tool_name"):
        if not isinstance(body.get(name), str) or not body[name]:
            return "invalid_field", f"{name} is required and must be a string."
    if not isinstance(body.get("arguments", {}), dict):
        return "invalid_field", "arguments must be an object."
    approval_id = body.get("approval_id")
    if approval_id is not None and (
        not isinstance(approval_id, str)
        or not 16 <= len(approval_id) <= 128
        or not approval_id[0].isalnum()
        or not all(ch.isalnum() or ch in "-_" for ch in approval_id)
    ):
        return "invalid_approval_id", "approval_id must be 16-128 URL-safe characters."
    timeout = body.get("timeout")
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0
    ):
        return "invalid_field", "timeout must be a positive number of seconds."
    return None
