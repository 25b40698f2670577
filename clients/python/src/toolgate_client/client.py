"""`ToolgateClient`: gate tool calls through toolgate's agent API, from sync or async code."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, Self
from urllib.parse import quote

import anyio
import httpx2

from . import __version__
from .errors import ToolgateError
from .protocol import (
    PENDING,
    Backoff,
    Decision,
    create_body,
    is_retryable_status,
    new_approval_id,
    read_answer,
)

__all__ = ["ToolgateClient"]

_CANCEL_GRACE = 5.0
# Worth another attempt: the server was unreachable, slow, or dropped the connection.
# A request this side cannot even send (LocalProtocolError, say) is not retried.
_RETRYABLE = (httpx2.NetworkError, httpx2.TimeoutException, httpx2.RemoteProtocolError)


class ToolgateClient:
    """A connection to toolgate's agent API for one key.

    `url` is where the host project mounts `approvals.urls` (for the demo site
    ``http://127.0.0.1:8000/api/inference/``); `key` is an agent key. Every request retries
    through network errors and 5xx answers with backoff for up to `retry_for` seconds in a
    row (``None``: forever); `wait` is how long one long-poll is held open (0-60 s).
    Safe to share between threads; the async methods may run on any one event loop at a
    time.
    """

    def __init__(
        self,
        url: str,
        key: str,
        *,
        wait: float = 30.0,
        retry_for: float | None = 600.0,
        initial_backoff: float = 0.25,
        max_backoff: float = 10.0,
        http_timeout: float = 15.0,
    ) -> None:
        if not 0 <= wait <= 60:
            raise ValueError("wait must be between 0 and 60 seconds")
        self.url = url if url.endswith("/") else url + "/"
        self.wait = wait
        self.retry_for = retry_for
        self.initial_backoff = initial_backoff
        self.max_backoff = max_backoff
        self.http_timeout = http_timeout
        self._headers = {
            "Accept": "application/json",
            "User-Agent": f"toolgate-client/{__version__}",
        }
        if key:
            self._headers["Authorization"] = f"Bearer {key}"
        self._sync: httpx2.Client | None = None
        self._async: httpx2.AsyncClient | None = None
        self._async_loop: object = None

    # -- sync -------------------------------------------------------------------------

    def request_tool_decision(
        self,
        session_id: str,
        tool_name: str,
        arguments: dict[str, Any] | None = None,
        *,
        tool_call_id: str = "",
        approval_id: str | None = None,
        timeout: float | None = None,
        description: str = "",
        editable: bool = False,
        arguments_schema: dict[str, Any] | None = None,
    ) -> Decision:
        """Gate one tool call and block until a person (or a rule, or the timeout) decides.

        Network errors, refused connections and 5xx answers are retried with the same
        `approval_id` (generated here when not given), so a server restart neither loses
        nor doubles the call. `timeout` is the call's decision timeout on the server. On
        KeyboardInterrupt the pending call is cancelled (best effort) before re-raising.
        """
        approval_id = approval_id or new_approval_id()
        body = create_body(
            session_id,
            tool_name,
            arguments,
            approval_id=approval_id,
            tool_call_id=tool_call_id,
            timeout=timeout,
            description=description,
            editable=editable,
            arguments_schema=arguments_schema,
        )
        try:
            approval = self._send("POST", "approvals", body=body)
            while approval.get("status") == PENDING:
                approval = self._send(
                    "GET", _path(approval_id), params={"wait": _wait_param(self.wait)}, long=True
                )
        except KeyboardInterrupt:
            self._cancel_quietly(approval_id)
            raise
        return Decision.from_approval(approval)

    def mark_executed(self, approval_id: str, ok: bool = True, summary: str = "") -> bool:
        """Record that the allowed call ran. ``False`` when it is not allowed or was reported
        already: a call runs once."""
        return self._report(approval_id, "executed", {"ok": ok, "summary": summary})

    def cancel(self, approval_id: str) -> bool:
        """Withdraw a pending call (`cancelled`). ``False`` when it was decided already."""
        return self._report(approval_id, "cancel", {})

    def close(self) -> None:
        """Close the sync connection pool (the async one closes with `aclose`)."""
        if self._sync is not None:
            self._sync.close()
            self._sync = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _report(self, approval_id: str, action: str, body: dict[str, Any]) -> bool:
        path = f"{_path(approval_id)}/{action}"
        attempts: list[int] = []
        try:
            self._send("POST", path, body=body, attempts=attempts)
        except ToolgateError as exc:
            if exc.status != 409:
                raise
            if len(attempts) > 1 and exc.code in _OWN_EARLIER_SUCCESS[action]:
                # An earlier attempt may have landed before its answer was lost.
                return _landed(action, self._send("GET", _path(approval_id)))
            return False
        return True

    def _cancel_quietly(self, approval_id: str) -> None:
        try:
            self._client().post(
                f"{_path(approval_id)}/cancel", json={}, timeout=_CANCEL_GRACE
            ).close()
        except httpx2.HTTPError:
            pass

    def _client(self) -> httpx2.Client:
        if self._sync is None:
            self._sync = httpx2.Client(
                base_url=self.url, headers=self._headers, timeout=self.http_timeout
            )
        return self._sync

    def _send(
        self,
        method: str,
        path: str,
        *,
        body: dict[str, Any] | None = None,
        params: dict[str, Any] | None = None,
        long: bool = False,
        attempts: list[int] | None = None,
    ) -> dict[str, Any]:
        backoff = self._backoff()
        timeout = self._timeout(long)
        while True:
            if attempts is not None:
                attempts.append(1)
            try:
                response = self._client().request(
                    method, path, json=body, params=params, timeout=timeout
                )
            except _RETRYABLE as exc:
                failure = f"{type(exc).__name__}: {exc}"
            else:
                if not is_retryable_status(response.status_code):
                    return read_answer(response.status_code, response.content)
                failure = f"HTTP {response.status_code}"
            time.sleep(backoff.next_delay(failure))

    # -- async ------------------------------------------------------------------------

    async def arequest_tool_decision(
        self,
        session_id: str,
        tool_name: str,
        arguments: dict[str, Any] | None = None,
        *,
        tool_call_id: str = "",
        approval_id: str | None = None,
        timeout: float | None = None,
        description: str = "",
        editable: bool = False,
        arguments_schema: dict[str, Any] | None = None,
    ) -> Decision:
        """The async twin of `request_tool_decision`: no thread is held while it waits.

        Cancelling the awaiting task cancels the pending call on the server (best effort,
        within a few seconds) before the cancellation propagates.
        """
        approval_id = approval_id or new_approval_id()
        body = create_body(
            session_id,
            tool_name,
            arguments,
            approval_id=approval_id,
            tool_call_id=tool_call_id,
            timeout=timeout,
            description=description,
            editable=editable,
            arguments_schema=arguments_schema,
        )
        try:
            approval = await self._asend("POST", "approvals", body=body)
            while approval.get("status") == PENDING:
                approval = await self._asend(
                    "GET", _path(approval_id), params={"wait": _wait_param(self.wait)}, long=True
                )
        except anyio.get_cancelled_exc_class():
            with anyio.move_on_after(_CANCEL_GRACE, shield=True):
                await self._acancel_quietly(approval_id)
            raise
        return Decision.from_approval(approval)

    async def amark_executed(self, approval_id: str, ok: bool = True, summary: str = "") -> bool:
        """The async twin of `mark_executed`."""
        return await self._areport(approval_id, "executed", {"ok": ok, "summary": summary})

    async def acancel(self, approval_id: str) -> bool:
        """The async twin of `cancel`."""
        return await self._areport(approval_id, "cancel", {})

    async def aclose(self) -> None:
        """Close the async connection pool."""
        if self._async is not None:
            await self._async.aclose()
            self._async = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
        self.close()

    async def _areport(self, approval_id: str, action: str, body: dict[str, Any]) -> bool:
        path = f"{_path(approval_id)}/{action}"
        attempts: list[int] = []
        try:
            await self._asend("POST", path, body=body, attempts=attempts)
        except ToolgateError as exc:
            if exc.status != 409:
                raise
            if len(attempts) > 1 and exc.code in _OWN_EARLIER_SUCCESS[action]:
                return _landed(action, await self._asend("GET", _path(approval_id)))
            return False
        return True

    async def _acancel_quietly(self, approval_id: str) -> None:
        try:
            response = await self._aclient().post(
                f"{_path(approval_id)}/cancel", json={}, timeout=_CANCEL_GRACE
            )
            await response.aclose()
        except httpx2.HTTPError:
            pass

    def _aclient(self) -> httpx2.AsyncClient:
        # A pool belongs to the event loop that opened it: a new loop (a second
        # asyncio.run, say) gets a new pool instead of a dead one.
        try:
            loop: object = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if self._async is None or self._async_loop is not loop:
            self._async = httpx2.AsyncClient(
                base_url=self.url, headers=self._headers, timeout=self.http_timeout
            )
            self._async_loop = loop
        return self._async

    async def _asend(
        self,
        method: str,
        path: str,
        *,
        body: dict[str, Any] | None = None,
        params: dict[str, Any] | None = None,
        long: bool = False,
        attempts: list[int] | None = None,
    ) -> dict[str, Any]:
        backoff = self._backoff()
        timeout = self._timeout(long)
        while True:
            if attempts is not None:
                attempts.append(1)
            try:
                response = await self._aclient().request(
                    method, path, json=body, params=params, timeout=timeout
                )
            except _RETRYABLE as exc:
                failure = f"{type(exc).__name__}: {exc}"
            else:
                if not is_retryable_status(response.status_code):
                    return read_answer(response.status_code, response.content)
                failure = f"HTTP {response.status_code}"
            await anyio.sleep(backoff.next_delay(failure))

    # -- shared -----------------------------------------------------------------------

    def _backoff(self) -> Backoff:
        return Backoff(
            initial=self.initial_backoff, maximum=self.max_backoff, retry_for=self.retry_for
        )

    def _timeout(self, long: bool) -> httpx2.Timeout:
        # A long-poll is held open for `wait` seconds by design; only then is silence an error.
        read = self.wait + self.http_timeout if long else self.http_timeout
        return httpx2.Timeout(self.http_timeout, read=read)


# The 409 codes that, after a retried POST, may mean our own earlier attempt landed.
_OWN_EARLIER_SUCCESS: dict[str, frozenset[str]] = {
    "executed": frozenset({"already_executed"}),
    "cancel": frozenset({"already_decided"}),
}
_LANDED: dict[str, Callable[[dict[str, Any]], bool]] = {
    "executed": lambda approval: approval.get("executed_at") is not None,
    "cancel": lambda approval: approval.get("status") == "cancelled",
}


def _landed(action: str, approval: dict[str, Any]) -> bool:
    return _LANDED[action](approval)


def _wait_param(wait: float) -> str:
    # "30", not "30.0": a server may read `wait` as an integer.
    return str(int(wait)) if float(wait).is_integer() else str(wait)


def _path(approval_id: str) -> str:
    return f"approvals/{quote(approval_id, safe='')}"
