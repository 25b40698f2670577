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
import threading
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.db import DatabaseError
from django.utils import timezone

from . import decisions, events, validation
from . import listener as listener_module
from .conf import setting
from .listener import Listener
from .models import Status, Via
from .validation import RequestError

#: Close code for a connection without a logged-in user (4000-4999 are the application's).
CLOSE_UNAUTHENTICATED = 4401
#: Event types a client is sent; anything else the listener carries is internal.
CLIENT_EVENTS = frozenset({"tool_start", "tool_decision"})
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
        self.session_filter = _session_filter(self.scope)
        self.sees_all = False  # set with the snapshot, before any event is sent
        self.known: set[str] = set()
        self.queue: asyncio.Queue = asyncio.Queue()
        # Subscribe before reading the snapshot: a call gated or decided in
        # between is then in the snapshot, in the queue, or both; never neither.
        hub = await _hub_for_running_loop()
        hub.join(self.queue)
        await self.accept()
        try:
            pending = await database_sync_to_async(self._snapshot)()
        except BaseException:
            _leave(self.queue)  # a socket that never got its snapshot must not linger
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
            _leave(queue)
        sender = getattr(self, "sender", None)
        if sender is not None:
            sender.cancel()

    # -- server -> client ------------------------------------------------
    def _snapshot(self) -> list[dict]:
        self.sees_all = decisions.may_decide_any(self.user)
        qs = decisions.visible_to(self.user).filter(
            status=Status.PENDING, expires_at__gt=timezone.now()
        )
        if self.session_filter is not None:
            qs = qs.filter(session_id=self.session_filter)
        rows = qs.order_by("created_at", "pk").values(*events.PENDING_FIELDS)
        return [events.pending_item(row) for row in rows[: setting("PENDING_LIMIT")]]

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
            await self._error(validation.INVALID_JSON, "Send JSON text frames, not binary ones.")
            return
        try:
            data = validation.parse_json(text_data)
        except RequestError as exc:
            await self._error(exc.code, exc.detail)
            return
        if data.get("type") != "tool_confirm":
            await self._error(
                validation.UNKNOWN_TYPE,
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
            request = validation.parse_decision(data)
        except RequestError as exc:
            return {**reply, "error": exc.code, "detail": exc.detail}
        try:
            outcome = await database_sync_to_async(self._decide)(request)
        except RequestError as exc:  # e.g. remember "session" on a call without a session
            return {**reply, "error": exc.code, "detail": exc.detail}
        except DatabaseError as exc:
            logger.warning("approvals: database unavailable for tool_confirm: %s", exc)
            code = validation.DATABASE_UNAVAILABLE
            return {**reply, "error": code, "detail": validation.ERROR_DETAILS[code]}
        if outcome.won:
            return {**reply, "resolved": True, "status": outcome.status}
        reply["error"] = outcome.error
        reply["detail"] = validation.ERROR_DETAILS.get(outcome.error, "")
        if outcome.error == validation.ALREADY_DECIDED:
            reply["status"] = outcome.status
        return reply

    def _decide(self, request: validation.DecisionRequest) -> decisions.Outcome:
        return decisions.decide(
            request.approval_id,
            decisions.status_for_answer(request.decision),
            via=Via.WEBSOCKET,
            by=self.user,
            viewer=self.user,
            reason=request.reason,
            session_id=request.session_id,
            remember=request.remember,
        )

    async def _error(self, code: str, detail: str) -> None:
        await self.send_json({"type": "error", "error": code, "detail": detail})


def _same_user(event_user: Any, pk: Any) -> bool:
    # Events from other processes carry a non-int primary key (a UUID) as a string.
    return event_user is not None and (event_user == pk or str(event_user) == str(pk))


def _session_filter(scope: dict) -> str | None:
    query = scope.get("query_string", b"")
    if isinstance(query, bytes):
        query = query.decode("latin-1")
    values = parse_qs(query, keep_blank_values=True).get("session_id")
    return values[0] if values and values[0] else None


class _Hub:
    """Fans the process listener's events out to the sockets of one event loop.

    One listener subscription and one thread hop per event and loop, however
    many sockets the loop serves; each event is encoded for clients once.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, listener: Listener) -> None:
        self.loop = loop
        self.listener = listener
        # Sockets that may see every user's calls, and the others by their user's
        # key: an event is queued only where it may be shown, so a thousand
        # sockets of other users cost nothing per event.
        self.everyone: set[asyncio.Queue] = set()
        self.by_user: dict[str, set[asyncio.Queue]] = {}
        self.unsubscribe: Callable[[], None] = _nothing

    @property
    def queues(self) -> set[asyncio.Queue]:
        """Every socket queue of this loop."""
        return self.everyone.union(*self.by_user.values())

    def join(self, queue: asyncio.Queue) -> None:
        self.everyone.add(queue)

    def narrow(self, queue: asyncio.Queue, user_pk: Any) -> None:
        self.everyone.discard(queue)
        self.by_user.setdefault(str(user_pk), set()).add(queue)

    def leave(self, queue: asyncio.Queue) -> None:
        self.everyone.discard(queue)
        for key, queues in list(self.by_user.items()):
            if queue in queues:
                queues.discard(queue)
                if not queues:
                    del self.by_user[key]

    def from_any_thread(self, event: dict) -> None:
        if event.get("type") not in CLIENT_EVENTS:
            return
        try:
            self.loop.call_soon_threadsafe(self._fan_out, event)
        except RuntimeError:  # the loop has closed
            _drop_hub(self)

    def _fan_out(self, event: dict) -> None:
        owner = event.get("_user_id")
        targets = list(self.everyone)
        if owner is not None:
            targets.extend(self.by_user.get(str(owner), ()))
        if not targets:
            return
        item = (event, json.dumps(events.public(event)))
        for queue in targets:
            queue.put_nowait(item)


_hubs: dict[asyncio.AbstractEventLoop, _Hub] = {}
_hubs_lock = threading.Lock()


async def _hub_for_running_loop() -> _Hub:
    loop = asyncio.get_running_loop()
    hub = _hubs.get(loop)
    if hub is not None and hub.listener is listener_module.current():
        return hub
    # Starting the listener may wait briefly for the channel layer: not on the loop.
    listener = await asyncio.to_thread(listener_module.get_listener)
    with _hubs_lock:
        old = _hubs.get(loop)
        if old is not None and old.listener is listener:
            return old
        hub = _hubs[loop] = _Hub(loop, listener)
    if old is not None:  # that listener was shut down; its sockets move here
        hub.everyone.update(old.everyone)
        for key, queues in old.by_user.items():
            hub.by_user.setdefault(key, set()).update(queues)
        old.unsubscribe()
    hub.unsubscribe = listener.subscribe(hub.from_any_thread)
    return hub


def _leave(queue: asyncio.Queue) -> None:
    hub = _hubs.get(asyncio.get_running_loop())
    if hub is not None:
        hub.leave(queue)
        if not hub.queues:
            _drop_hub(hub)


def _drop_hub(hub: _Hub) -> None:
    with _hubs_lock:
        if _hubs.get(hub.loop) is not hub:
            return
        if hub.queues and not hub.loop.is_closed():
            return
        del _hubs[hub.loop]
    hub.unsubscribe()


def _nothing() -> None:
    return None
