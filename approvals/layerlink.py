"""The process listener's link to the other processes over the channel layer.

One per process, on one event loop in one thread: it never starts a loop (or a
Redis pool) per message. It uses its own instance of the configured layer, so
its receive loop never collides with the host's consumers receiving on the
shared instance from daphne's loop. Messages leave in the order they were
handed over; the group membership is renewed periodically and after every
error, so a Redis restart costs at most a few seconds of the fast path (the
database re-check covers that gap).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("approvals.listener")

#: Messages the layer may hold for one listener channel before it drops more.
LISTENER_CAPACITY = 10_000
#: Seconds between renewals of the group membership (cheap: one ZADD).
GROUP_REFRESH = 10.0
#: Socket read timeout for the listener's Redis connections: longer than the
#: 5 s blocking pop channels_redis waits on, short enough to notice a dead link.
READ_TIMEOUT = 15.0
#: The longest :meth:`LayerLink.start` waits for the first group join.
JOIN_WAIT = 2.0


class LayerLink:
    """Sends events to, and receives events from, the other processes' listeners."""

    def __init__(self, layer: Any, group: str, on_message: Callable[[dict], None]) -> None:
        self.layer = layer
        self.group = group
        self.on_message = on_message
        self.loop: asyncio.AbstractEventLoop | None = None
        self.channel: str | None = None
        self.sent = 0
        self.received = 0
        self._outbox: asyncio.Queue | None = None
        self._joined = threading.Event()
        self._stopping = False
        self._send_failing = False
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------
    def start(self) -> None:
        """Start the loop thread; wait briefly for the first join (never longer than JOIN_WAIT)."""
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(ready,), name="toolgate-layer", daemon=True
        )
        self._thread.start()
        ready.wait(JOIN_WAIT)
        self._joined.wait(JOIN_WAIT)

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping = True
        loop = self.loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(loop.stop)
            except RuntimeError:
                pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    @property
    def joined(self) -> bool:
        return self._joined.is_set()

    # -- sending ---------------------------------------------------------
    def send(self, message: dict) -> None:
        """Queue ``message`` for the group; returns at once, from any thread."""
        loop, outbox = self.loop, self._outbox
        if loop is None or outbox is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(outbox.put_nowait, message)
        except RuntimeError:  # the loop is closing
            pass

    async def _send_forever(self) -> None:
        while True:
            message = await self._outbox.get()
            try:
                await self.layer.group_send(self.group, message)
                self.sent += 1
                if self._send_failing:
                    self._send_failing = False
                    logger.warning("approvals: channel layer sends work again")
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the database re-check carries it instead
                if not self._send_failing:
                    self._send_failing = True
                    logger.warning(
                        "approvals: channel layer send failed (%s); the re-check covers", exc
                    )

    # -- receiving -------------------------------------------------------
    def _run(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self.loop = loop
        self._outbox = asyncio.Queue()
        tasks = [
            loop.create_task(self._send_forever()),
            loop.create_task(self._receive_forever()),
            loop.create_task(self._refresh_forever()),
        ]
        ready.set()
        try:
            loop.run_forever()
        finally:
            for task in tasks:
                task.cancel()
            try:
                loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
                close = getattr(self.layer, "close_pools", None)
                if close is not None:
                    loop.run_until_complete(asyncio.wait_for(close(), 2))
            except Exception:
                pass
            loop.close()

    async def _join(self) -> str:
        channel = self.channel or await self.layer.new_channel(f"{self.group}.listener")
        await self.layer.group_add(self.group, channel)
        self.channel = channel
        self._joined.set()
        return channel

    async def _receive_forever(self) -> None:
        backoff = 0.1
        while not self._stopping:
            try:
                channel = await self._join()
                backoff = 0.1
                while True:
                    message = await self.layer.receive(channel)
                    self.received += 1
                    try:
                        self.on_message(message)
                    except Exception:
                        logger.exception("approvals: handling a layer message failed")
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.warning("approvals: channel layer receive failed (%s); retrying", exc)
                self._joined.set()  # do not keep start() waiting on a layer that is down
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    async def _refresh_forever(self) -> None:
        # A restarted Redis forgets the group; renewing is what brings us back into it.
        last = time.monotonic()
        while True:
            await asyncio.sleep(1.0)
            if self.channel is None or time.monotonic() - last < GROUP_REFRESH:
                continue
            last = time.monotonic()
            try:
                await self.layer.group_add(self.group, self.channel)
            except asyncio.CancelledError:
                raise
            except Exception:
                pass  # the receive loop reports and retries


def own_layer_instance(alias: str) -> Any:
    """A fresh instance of the layer configured as ``alias``, or ``None``.

    ``None`` when the alias is not configured or is the in-memory layer (which
    never crosses a process boundary). The instance is the listener's alone;
    for ``channels_redis`` its capacity is raised so a burst of events is not
    dropped on the way to a busy listener.
    """
    from channels.layers import InMemoryChannelLayer
    from django.conf import settings
    from django.utils.module_loading import import_string

    configs = getattr(settings, "CHANNEL_LAYERS", None) or {}
    if alias not in configs or not configs[alias].get("BACKEND"):
        return None
    backend = import_string(configs[alias]["BACKEND"])
    if issubclass(backend, InMemoryChannelLayer):
        return None
    config = dict(configs[alias].get("CONFIG", {}) or {})
    if configs[alias]["BACKEND"].endswith("core.RedisChannelLayer"):
        config["capacity"] = max(int(config.get("capacity", 100)), LISTENER_CAPACITY)
        config["hosts"] = _with_read_timeout(config.get("hosts"))
    return backend(**config)


def _with_read_timeout(hosts: Any) -> list:
    """Host entries whose socket read timeout outlasts channels_redis's blocking pop.

    channels_redis waits on ``BZPOPMIN`` for 5 s; redis-py 8 defaults
    ``socket_timeout`` to 5 s too, so an idle receive fails every few seconds
    (django/channels_redis#422). A timeout left unset, or shorter than the pop,
    becomes ``READ_TIMEOUT``; an explicit ``None`` (wait forever) is kept.
    """
    entries = []
    for host in hosts or ["redis://localhost:6379"]:
        if isinstance(host, str):
            entry = {"address": host}
        elif isinstance(host, list | tuple):
            entry = {"host": host[0], "port": host[1]}
        else:
            entry = dict(host)
        timeout = entry.get("socket_timeout", _UNSET)
        if timeout is _UNSET or (timeout is not None and timeout < READ_TIMEOUT):
            entry["socket_timeout"] = READ_TIMEOUT
        entries.append(entry)
    return entries


_UNSET = object()
