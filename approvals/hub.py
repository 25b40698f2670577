"""The fan-out hub: the process listener's events, handed to the sockets of one event loop.

One listener subscription and one thread hop per event and loop, however many
sockets the loop serves; each event is encoded for clients once, and queued
only for sockets that may show it.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import json
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from importlib import import_module
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import close_old_connections
from django.utils import timezone

from . import events
from . import listener as listener_module
from .conf import setting
from .listener import Listener
from .permissions import may_decide_any

logger = logging.getLogger("approvals.hub")
#: Close code for a socket whose user was deactivated or signed out elsewhere.
CLOSE_SIGNED_OUT = 4401
#: Close code for a socket that fell too far behind (it reconnects for a fresh snapshot).
CLOSE_TOO_SLOW = 4408


class SocketQueue(asyncio.Queue):
    """One socket's outgoing events, bounded, with the socket it feeds.

    ``socket`` has ``user_pk``, ``session_key``, ``sees_all`` and an async
    ``drop(code)``; the hub closes it when its queue overflows, and re-checks
    its user every ``SOCKET_RECHECK_SECONDS``.
    """

    def __init__(self, socket: Any) -> None:
        super().__init__(maxsize=setting("SOCKET_QUEUE_LIMIT"))
        self.socket = socket
        self.dropped = False

    def offer(self, item: Any) -> None:
        if self.dropped:
            return
        try:
            self.put_nowait(item)
        except asyncio.QueueFull:
            self.dropped = True
            logger.warning("approvals: closing a socket that fell %s events behind", self.maxsize)
            asyncio.ensure_future(self.socket.drop(CLOSE_TOO_SLOW))

    def close(self) -> None:
        """Take no more events and let go of the queued ones now.

        The queue and its consumer refer to each other, so without this the
        events of a socket that fell behind (megabytes) would wait for Python's
        cyclic collector after the socket is gone.
        """
        self.dropped = True
        while not self.empty():
            self.get_nowait()


#: Seconds after a socket is closed for being too slow before its buffers are collected:
#: autobahn gives a client one second to answer the close, then drops the connection.
COLLECT_AFTER_SLOW_CLOSE = 3.0
_collecting: set[asyncio.AbstractEventLoop] = set()


def collect_soon() -> None:
    """Run Python's full collection once, a few seconds from now (one per burst of closes).

    A closed connection's Twisted transport keeps the bytes its client never read
    (up to ``SOCKET_BACKLOG_BYTES``) and sits in reference cycles with daphne's and
    autobahn's protocol objects, so it is freed only by a full collection, which an
    idle server may not run for hours: twenty stuck sockets held 84 MB that way.
    """
    loop = asyncio.get_running_loop()
    if loop in _collecting:
        return
    _collecting.add(loop)

    def collect() -> None:
        _collecting.discard(loop)
        gc.collect()
        _trim_heap()

    loop.call_later(COLLECT_AFTER_SLOW_CLOSE, collect)


def _trim_heap() -> None:
    """Give the C heap's free pages back to the system (glibc only; elsewhere nothing).

    The freed buffers are megabyte blocks that glibc's malloc keeps for reuse;
    measured with twenty stuck sockets, the process stayed 40-70 MB above where
    it started after the collection alone, and came back to it with this.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


#: The most ``PREVIEW_BYTES`` and ``SNAPSHOT_MAX_BYTES`` may use, whatever the settings
#: say: daphne (autobahn) refuses a frame over 1 MiB. Frames are ASCII JSON, where a
#: 4-byte character takes 12: a 192 KiB preview, a 64 KiB schema and a description
#: stay under 1 MiB.
MAX_PREVIEW_BYTES = 192 * 1024
MAX_SNAPSHOT_BYTES = 768 * 1024


def preview_bytes() -> int:
    """The largest ``arguments`` a socket frame carries in full."""
    return min(int(setting("PREVIEW_BYTES")), MAX_PREVIEW_BYTES)


def snapshot_bytes() -> int:
    """The largest snapshot frame."""
    return min(int(setting("SNAPSHOT_MAX_BYTES")), MAX_SNAPSHOT_BYTES)


#: Event types a client is sent; anything else the listener carries is internal.
CLIENT_EVENTS = frozenset({"tool_start", "tool_decision"})


class Hub:
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
        self.rechecking: asyncio.Task | None = None

    @property
    def queues(self) -> set[asyncio.Queue]:
        """Every socket queue of this loop."""
        return self.everyone.union(*self.by_user.values())

    def join(self, queue: asyncio.Queue) -> None:
        self.everyone.add(queue)
        if self.rechecking is None or self.rechecking.done():
            self.rechecking = self.loop.create_task(self._recheck_forever())

    def sockets_of(self, user_pk: Any) -> int:
        """How many sockets of this loop belong to ``user_pk``."""
        key = str(user_pk)
        return sum(1 for q in self.queues if str(getattr(q.socket, "user_pk", None)) == key)

    async def _recheck_forever(self) -> None:
        # One timer per loop, one batch of queries per pass, however many sockets.
        while self.queues:
            await asyncio.sleep(setting("SOCKET_RECHECK_SECONDS"))
            try:
                await self.recheck()
            except Exception:  # a database outage: try again next pass
                logger.warning("approvals: socket re-check failed", exc_info=True)

    async def recheck(self) -> None:
        """Close the sockets of users deactivated or signed out; narrow lost deciders."""
        sockets = [q.socket for q in self.queues if hasattr(q, "socket")]
        if not sockets:
            return
        users = {str(s.user_pk) for s in sockets}
        wide = {str(s.user_pk) for s in sockets if s.sees_all}
        keys = {s.session_key for s in sockets if s.session_key}
        active, deciders, live = await db_call(_current_state, users, wide, keys)
        for socket in sockets:
            pk = str(socket.user_pk)
            if pk not in active or (live is not None and socket.session_key not in live):
                await socket.drop(CLOSE_SIGNED_OUT)
            elif socket.sees_all and pk not in deciders:
                socket.sees_all = False
                self.narrow(socket.queue, socket.user_pk)

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
        item = (event, json.dumps(events.with_preview(events.public(event), preview_bytes())))
        for queue in targets:
            queue.offer(item) if isinstance(queue, SocketQueue) else queue.put_nowait(item)


_hubs: dict[asyncio.AbstractEventLoop, Hub] = {}
_hubs_lock = threading.Lock()


async def hub_for_running_loop() -> Hub:
    """The hub of the running loop, joined to this process's listener (started if need be)."""
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
        hub = _hubs[loop] = Hub(loop, listener)
    if old is not None:  # that listener was shut down; its sockets move here
        hub.everyone.update(old.everyone)
        for key, queues in old.by_user.items():
            hub.by_user.setdefault(key, set()).update(queues)
        old.unsubscribe()
    hub.unsubscribe = listener.subscribe(hub.from_any_thread)
    return hub


def leave(queue: asyncio.Queue) -> None:
    """Take a socket's queue out of the running loop's hub."""
    hub = _hubs.get(asyncio.get_running_loop())
    if hub is not None:
        hub.leave(queue)
        if not hub.queues:
            _drop_hub(hub)


def _drop_hub(hub: Hub) -> None:
    with _hubs_lock:
        if _hubs.get(hub.loop) is not hub:
            return
        if hub.queues and not hub.loop.is_closed():
            return
        del _hubs[hub.loop]
    hub.unsubscribe()
    if hub.rechecking is not None and not hub.loop.is_closed():
        hub.rechecking.cancel()


def _nothing() -> None:
    return None


def _current_state(users: set[str], wide: set[str], keys: set[str]) -> tuple:
    """(active user keys, deciders among ``wide``, live session keys or ``None``)."""
    found = get_user_model()._default_manager.filter(pk__in=users, is_active=True)
    active = {str(user.pk): user for user in found}
    deciders = {pk for pk in wide if pk in active and may_decide_any(active[pk])}
    return set(active), deciders, live_sessions(keys)


def live_sessions(keys: set[str]) -> set[str] | None:
    """The keys among ``keys`` whose session still exists; ``None`` when sessions
    live in the cookie (nothing on the server to delete)."""
    engine = import_module(settings.SESSION_ENGINE)
    store = engine.SessionStore
    if settings.SESSION_ENGINE.endswith("signed_cookies"):
        return None
    if hasattr(store, "get_model_class") and not settings.SESSION_ENGINE.endswith("cache"):
        model = store.get_model_class()
        rows = model.objects.filter(session_key__in=keys, expire_date__gt=timezone.now())
        return set(rows.values_list("session_key", flat=True))
    return {key for key in keys if store().exists(key)}


_executor: ThreadPoolExecutor | None = None


def _closing(fn: Callable, *args: Any) -> Any:
    # As Django does around each request: a connection that failed or outlived
    # CONN_MAX_AGE is closed, a healthy one is kept for this pool thread's next
    # call (a new PostgreSQL connection per frame cost more than the decision).
    close_old_connections()
    try:
        return fn(*args)
    finally:
        close_old_connections()


async def db_call(fn: Callable, *args: Any) -> Any:
    """Run ``fn(*args)`` on the sockets' own thread pool (``SOCKET_DB_THREADS``).

    Channels' ``database_sync_to_async`` runs every consumer's database work of
    a process on one thread, so one locked or slow query holds up every other
    socket; here each call gets a thread of a bounded pool, whose connection is
    checked before and after as Django checks a request's (``CONN_MAX_AGE``).
    """
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(setting("SOCKET_DB_THREADS"), "approvals-socket-db")
    call = sync_to_async(_closing, thread_sensitive=False, executor=_executor)
    return await call(fn, *args)
