"""The live inbox over WebSocket: a snapshot on connect, then every gated and decided call.

A connection carries only approvals its user may see (their own; every one
with ``approvals.decide_approval``); ``?session_id=`` narrows it to one
session. Events come from this process's listener, which already gathers them
from every process (channel layer, database re-check), so a socket needs no
channel-layer channel of its own and keeps working while Redis is away.
Clients decide with ``tool_confirm`` frames, checked exactly like the HTTP
endpoint and decided through :func:`approvals.decisions.decide`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any
from urllib.parse import parse_qs

from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.contrib.auth import get_user_model
from django.db import DatabaseError

from . import _compat, errors, events, payloads
from .conf import setting
from .decisions import Outcome
from .errors import RequestError
from .hub import (
    CLIENT_EVENTS,
    CLOSE_SIGNED_OUT,
    CLOSE_TOO_SLOW,
    SocketQueue,
    collect_soon,
    db_call,
    hub_for_running_loop,
    leave,
    live_sessions,
    preview_bytes,
    snapshot_bytes,
)
from .models import Approval, Via
from .permissions import may_decide_any

#: Close code for a connection without a logged-in user (4000-4999 are the application's).
CLOSE_UNAUTHENTICATED = 4401
#: Close code for a connection whose ``?session_id=`` cannot name a session.
CLOSE_BAD_REQUEST = 4400
#: Close code for one socket more than ``MAX_SOCKETS_PER_USER``.
CLOSE_TOO_MANY = 4429
#: Close code after a frame could not be sent (the page reconnects).
CLOSE_SEND_FAILED = 4500
#: A channel-layer alias nobody configures: Channels then gives the consumer no
#: channel of its own (no per-socket receive on Redis), see ``get_channel_layer``.
logger = logging.getLogger("approvals.consumers")
NO_CHANNEL_LAYER = "approvals.consumers.no-channel-layer"


class ApprovalsConsumer(AsyncJsonWebsocketConsumer):
    """One person's live view of pending tool calls, and where they answer them."""

    channel_layer_alias = NO_CHANNEL_LAYER

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not getattr(user, "is_authenticated", False):
            # Browsers see a close code only after the handshake completed.
            await self.accept()
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.user = user
        try:
            self.session_filter = payloads.session_filter(_query_session_id(self.scope))
        except RequestError as exc:
            await self.accept()
            await self._error(exc.code, exc.detail)
            await self.close(code=CLOSE_BAD_REQUEST)
            return
        self.user_pk = user.pk
        session = self.scope.get("session")
        self.session_key = getattr(session, "session_key", None)
        self.sees_all = False  # set with the snapshot, before any event is sent
        self.known: set[str] = set()
        hub = await hub_for_running_loop()
        if hub.sockets_of(user.pk) >= setting("MAX_SOCKETS_PER_USER"):
            await self.accept()
            await self._error("too_many_sockets", "Too many open inboxes for this user.")
            await self.close(code=CLOSE_TOO_MANY)
            return
        self.queue = SocketQueue(self)
        self.unsent = _compat.unsent_bytes_probe(self.base_send)
        # Subscribe before reading the snapshot: a call gated or decided in
        # between is then in the snapshot, in the queue, or both; never neither.
        hub.join(self.queue)
        await self.accept()
        try:
            pending = await db_call(self._snapshot)
        except BaseException:
            leave(self.queue)  # a socket that never got its snapshot must not linger
            raise
        if not self.sees_all:
            # From here on only this user's events are queued for this socket.
            hub.narrow(self.queue, self.user.pk)
        self.known.update(item["approval_id"] for item in pending["pending"])
        await self.send(text_data=json.dumps({"type": "snapshot", **pending}))
        self.sender = asyncio.create_task(self._send_events())

    async def drop(self, code: int) -> None:
        """Stop this socket's events at once and close it with ``code``."""
        queue = getattr(self, "queue", None)
        if queue is not None:
            queue.close()
            leave(queue)
        try:
            await self.close(code=code)
        except Exception:  # the connection is gone already
            pass
        if code == CLOSE_TOO_SLOW:
            collect_soon()  # what the server buffered for it is megabytes

    async def disconnect(self, code: int) -> None:
        queue = getattr(self, "queue", None)
        if queue is not None:
            queue.close()
            leave(queue)
        sender = getattr(self, "sender", None)
        if sender is not None:
            sender.cancel()

    # -- server -> client ------------------------------------------------
    def _snapshot(self) -> dict:
        self.sees_all = may_decide_any(self.user)
        qs = Approval.objects.visible_to(self.user).awaiting().in_session(self.session_filter)
        return _within_bytes(qs.pending_items(setting("PENDING_LIMIT")))

    def may_see(self, event: dict) -> bool:
        """True when this connection should carry ``event``."""
        if event.get("type") not in CLIENT_EVENTS:
            return False
        if not self.sees_all and not _same_user(event.get("_user_id"), self.user.pk):
            return False
        return self.session_filter is None or event.get("session_id") == self.session_filter

    async def _send_events(self) -> None:
        # One task drains the queue, so events leave in the order they arrived.
        try:
            await self._drain()
        except asyncio.CancelledError:
            raise
        except Exception:
            # A frame that cannot be sent must not leave a "live" socket that
            # receives nothing: close it, and the page reconnects for a snapshot.
            logger.warning("approvals: closing a socket after a failed send", exc_info=True)
            await self.drop(CLOSE_SEND_FAILED)

    async def _drain(self) -> None:
        limit = setting("SOCKET_BACKLOG_BYTES")
        while not self.queue.dropped:
            event, text = await self.queue.get()
            if not self.may_see(event):
                continue
            aid = event.get("approval_id")
            if event["type"] == "tool_start":
                if aid in self.known:
                    continue  # already in the snapshot
            else:
                self.known.discard(aid)
            if self.unsent is not None and self.unsent() > limit:
                logger.warning("approvals: closing a socket whose client stopped reading")
                await self.drop(CLOSE_TOO_SLOW)
                return
            await self.send(text_data=text)

    # -- client -> server ------------------------------------------------
    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """Answer every frame; a bad one gets an error message, never a closed socket."""
        if text_data is None:
            await self._error(errors.INVALID_JSON, "Send JSON text frames, not binary ones.")
            return
        try:
            data = payloads.parse_json(text_data)
        except RequestError as exc:
            await self._error(exc.code, exc.detail)
            return
        if data.get("type") != "tool_confirm":
            await self._error(
                errors.UNKNOWN_TYPE,
                'The only message a client sends is {"type": "tool_confirm", ...}.',
            )
            return
        await self.send_json(await self._confirm(data))

    async def _confirm(self, data: dict) -> dict:
        approval_id = data.get("approval_id")
        reply: dict[str, Any] = {
            "type": "tool_confirm_result",
            "approval_id": approval_id if isinstance(approval_id, str) else None,
            "resolved": False,
        }
        try:
            request = payloads.parse_decision(data)
        except RequestError as exc:
            return {**reply, "error": exc.code, "detail": exc.detail}
        try:
            outcome = await db_call(self._decide, request)
        except SignedOut:
            asyncio.ensure_future(self.drop(CLOSE_SIGNED_OUT))
            code = errors.AUTHENTICATION_REQUIRED
            return {**reply, "error": code, "detail": errors.detail_for(code)}
        except RequestError as exc:  # e.g. remember "session" on a call without a session
            return {**reply, "error": exc.code, "detail": exc.detail}
        except DatabaseError as exc:
            logger.warning("approvals: database unavailable for tool_confirm: %s", exc)
            code = errors.DATABASE_UNAVAILABLE
            return {**reply, "error": code, "detail": errors.detail_for(code)}
        if outcome.won:
            return {**reply, "resolved": True, "status": outcome.status}
        reply["error"] = outcome.error
        reply["detail"] = errors.detail_for(outcome.error)
        if outcome.error == errors.ALREADY_DECIDED:
            reply["status"] = outcome.status
        return reply

    def _decide(self, request: payloads.DecisionRequest) -> Outcome:
        # The user and their permissions as they are now, not as at connect.
        user = get_user_model()._default_manager.filter(pk=self.user_pk, is_active=True).first()
        if user is None:
            raise SignedOut
        if self.session_key and live_sessions({self.session_key}) == set():
            raise SignedOut
        return payloads.decide_request(request, user, Via.WEBSOCKET)

    async def _error(self, code: str, detail: str) -> None:
        await self.send_json({"type": "error", "error": code, "detail": detail})


class SignedOut(Exception):
    """The socket's user was deactivated or their session ended since connect."""


def _within_bytes(items: list[dict]) -> dict:
    """The snapshot's body: the oldest items within ``SNAPSHOT_MAX_BYTES``, and how many more
    (each item's arguments cut to ``PREVIEW_BYTES``)."""
    budget = snapshot_bytes() - 64
    limit = preview_bytes()
    kept: list[dict] = []
    for item in items:
        item = events.with_preview(item, limit)
        budget -= len(json.dumps(item)) + 1
        if budget < 0:
            break
        kept.append(item)
    body: dict[str, Any] = {"pending": kept}
    if len(kept) < len(items):
        body["more"] = len(items) - len(kept)
    return body


def _same_user(event_user: Any, pk: Any) -> bool:
    # Events from other processes carry a non-int primary key (a UUID) as a string.
    return event_user is not None and (event_user == pk or str(event_user) == str(pk))


def _query_session_id(scope: dict) -> str | None:
    query = scope.get("query_string", b"")
    if isinstance(query, bytes):
        query = query.decode("latin-1")
    values = parse_qs(query, keep_blank_values=True).get("session_id")
    return values[0] if values else None
