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
import logging
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.db import DatabaseError

from . import errors, payloads
from .conf import setting
from .decisions import Outcome
from .errors import RequestError
from .hub import CLIENT_EVENTS, hub_for_running_loop, leave
from .models import Approval, Via
from .permissions import may_decide_any

#: Close code for a connection without a logged-in user (4000-4999 are the application's).
CLOSE_UNAUTHENTICATED = 4401
#: Close code for a connection whose ``?session_id=`` cannot name a session.
CLOSE_BAD_REQUEST = 4400
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
        self.sees_all = False  # set with the snapshot, before any event is sent
        self.known: set[str] = set()
        self.queue: asyncio.Queue = asyncio.Queue()
        # Subscribe before reading the snapshot: a call gated or decided in
        # between is then in the snapshot, in the queue, or both; never neither.
        hub = await hub_for_running_loop()
        hub.join(self.queue)
        await self.accept()
        try:
            pending = await database_sync_to_async(self._snapshot)()
        except BaseException:
            leave(self.queue)  # a socket that never got its snapshot must not linger
            raise
        if not self.sees_all:
            # From here on only this user's events are queued for this socket.
            hub.narrow(self.queue, self.user.pk)
        self.known.update(item["approval_id"] for item in pending)
        await self.send_json({"type": "snapshot", "pending": pending})
        self.sender = asyncio.create_task(self._send_events())

    async def disconnect(self, code: int) -> None:
        queue = getattr(self, "queue", None)
        if queue is not None:
            leave(queue)
        sender = getattr(self, "sender", None)
        if sender is not None:
            sender.cancel()

    # -- server -> client ------------------------------------------------
    def _snapshot(self) -> list[dict]:
        self.sees_all = may_decide_any(self.user)
        qs = Approval.objects.visible_to(self.user).awaiting().in_session(self.session_filter)
        return qs.pending_items(setting("PENDING_LIMIT"))

    def may_see(self, event: dict) -> bool:
        """True when this connection should carry ``event``."""
        if event.get("type") not in CLIENT_EVENTS:
            return False
        if not self.sees_all and not _same_user(event.get("_user_id"), self.user.pk):
            return False
        return self.session_filter is None or event.get("session_id") == self.session_filter

    async def _send_events(self) -> None:
        # One task drains the queue, so events leave in the order they arrived.
        while True:
            event, text = await self.queue.get()
            if not self.may_see(event):
                continue
            aid = event.get("approval_id")
            if event["type"] == "tool_start":
                if aid in self.known:
                    continue  # already in the snapshot
            else:
                self.known.discard(aid)
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
            outcome = await database_sync_to_async(self._decide)(request)
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
        return payloads.decide_request(request, self.user, Via.WEBSOCKET)

    async def _error(self, code: str, detail: str) -> None:
        await self.send_json({"type": "error", "error": code, "detail": detail})


def _same_user(event_user: Any, pk: Any) -> bool:
    # Events from other processes carry a non-int primary key (a UUID) as a string.
    return event_user is not None and (event_user == pk or str(event_user) == str(pk))


def _query_session_id(scope: dict) -> str | None:
    query = scope.get("query_string", b"")
    if isinstance(query, bytes):
        query = query.decode("latin-1")
    values = parse_qs(query, keep_blank_values=True).get("session_id")
    return values[0] if values else None
