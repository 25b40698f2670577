"""The channel-layer link: how the process listener reaches the other processes.

One per process, on one event loop in one thread: it never starts a loop (or a
Redis pool) per message. It uses its own layer instance, so its receive loop
never collides with the host's consumers receiving on the shared instance
from daphne's loop; for ``channels_redis`` that instance is the pub/sub layer
on the same Redis (see :func:`own_layer_instance`). Messages leave in the
order they were handed over. After Redis restarts, the link reconnects and
subscribes again by itself, and group membership is renewed periodically for
layers that forget groups; meanwhile the database re-check carries events.

Messages handed over while a send is under way leave together, as one
``approvals.batch`` message (at most ``BATCH_MAX``): under a burst of
decisions a process publishes, and every process (itself included: pub/sub
echoes) decodes, one message per batch instead of one per event, and the
link's thread wakes once per batch. A lone message leaves as it is, so that
an idle process sends exactly what it did before batching existed.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

logger = logging.getLogger("approvals.listener")
_GROUP_NAME = re.compile(r"[a-zA-Z0-9._-]+")

#: Seconds between renewals of the group membership (cheap: one ZADD).
GROUP_REFRESH = 10.0
#: Socket read timeout for the listener's Redis connections: longer than any
#: blocking read channels_redis makes, short enough to notice a dead link.
READ_TIMEOUT = 15.0
#: The longest :meth:`LayerLink.start` waits for the first group join.
JOIN_WAIT = 2.0
#: The type of a message that carries several, in order, under ``"messages"``.
BATCH_TYPE = "approvals.batch"
#: The most messages one batch carries.
BATCH_MAX = 100


class LayerLink:
    """Sends events to, and receives events from, the other processes' listeners."""

    def __init__(self, layer: Any, group: str, on_message: Callable[[dict], None]) -> None:
        if not _GROUP_NAME.fullmatch(group) or len(group) >= 100:
            raise ImproperlyConfigured(
                f"The channel-layer group {group!r} is not valid: APPROVALS['GROUP_PREFIX'] "
                "may hold only letters, digits, '.', '_' and '-', at most 90 characters."
            )
        self.layer = layer
        self.group = group
        self.on_message = on_message
        self.loop: asyncio.AbstractEventLoop | None = None
        self.channel: str | None = None
        self.sent = 0
        self.received = 0
        #: Marks this link's own batches, so their echo is dropped undecoded.
        self.token = secrets.token_hex(8)
        self._pending: list[dict] = []
        self._pending_lock = threading.Lock()
        self._wake_scheduled = False
        self._ready: asyncio.Event | None = None
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
        loop, ready = self.loop, self._ready
        if loop is None or ready is None or loop.is_closed():
            return
        with self._pending_lock:
            self._pending.append(message)
            if self._wake_scheduled:
                return  # the link's thread is told already; it takes this one too
            self._wake_scheduled = True
        try:
            loop.call_soon_threadsafe(ready.set)
        except RuntimeError:  # the loop is closing
            pass

    def _take(self) -> list[dict]:
        with self._pending_lock:
            taken, self._pending = self._pending, []
            self._wake_scheduled = False
        return taken

    async def _send_forever(self) -> None:
        while True:
            await self._ready.wait()
            self._ready.clear()
            taken = self._take()
            for start in range(0, len(taken), BATCH_MAX):
                chunk = taken[start : start + BATCH_MAX]
                if len(chunk) == 1:
                    await self._send_one(chunk[0], 1)
                else:
                    batch = {"type": BATCH_TYPE, "link": self.token, "messages": chunk}
                    await self._send_one(batch, len(chunk))

    async def _send_one(self, message: dict, count: int) -> None:
        try:
            await self.layer.group_send(self.group, message)
            self.sent += count
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

    def _unpack(self, message: dict) -> Iterator[dict]:
        """The messages ``message`` carries: itself, or a batch's, none from our own batch."""
        if message.get("type") != BATCH_TYPE:
            yield message
            return
        if message.get("link") == self.token:
            return
        inner = message.get("messages")
        if isinstance(inner, list):
            yield from (one for one in inner if isinstance(one, dict))

    # -- receiving -------------------------------------------------------
    def _run(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self.loop = loop
        self._ready = asyncio.Event()
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
                if hasattr(type(self.layer), "close_pools"):  # never flush(): it deletes keys
                    loop.run_until_complete(asyncio.wait_for(self.layer.close_pools(), 2))
            except Exception:
                pass
            loop.close()

    async def _join(self) -> str:
        channel = self.channel or await self.layer.new_channel("toolgate")
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
                    for one in self._unpack(message):
                        self.received += 1
                        try:
                            self.on_message(one)
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


def is_in_memory(alias: str) -> bool:
    """True when the layer ``alias`` is configured as Channels' in-memory layer."""
    from channels.layers import InMemoryChannelLayer, channel_layers

    config = channel_layers.configs.get(alias) or {}
    path = config.get("BACKEND")
    if not path:
        return False
    try:
        backend = import_string(path)
    except ImportError:
        return False
    return isinstance(backend, type) and issubclass(backend, InMemoryChannelLayer)


def own_layer_instance(alias: str) -> Any:
    """A fresh layer instance for the listener, or ``None`` without a cross-process layer.

    ``None`` when the alias is not configured or is the in-memory layer (which
    never crosses a process boundary). When the alias is
    ``channels_redis.core.RedisChannelLayer``, the listener talks to the same
    Redis through ``channels_redis``'s pub/sub layer instead: its events are
    hints backed by the database, so at-most-once pub/sub is enough, and it
    is several times faster than the list-based layer (no per-channel queue to
    pop, no capacity to overflow). Any other backend is made as configured.
    """
    from channels.layers import channel_layers

    config = channel_layers.configs.get(alias) or {}
    path = config.get("BACKEND")
    if not path or is_in_memory(alias):
        return None
    options = dict(config.get("CONFIG", {}) or {})
    if path.endswith("core.RedisChannelLayer"):
        from channels_redis.pubsub import RedisPubSubChannelLayer

        kept = ("prefix", "symmetric_encryption_keys", "serializer_format")
        kwargs = {key: options[key] for key in kept if key in options}
        return RedisPubSubChannelLayer(hosts=_with_read_timeout(options.get("hosts")), **kwargs)
    if path.endswith("pubsub.RedisPubSubChannelLayer"):
        options["hosts"] = _with_read_timeout(options.get("hosts"))
        return import_string(path)(**options)
    return channel_layers.make_backend(alias)


def _with_read_timeout(hosts: Any) -> list:
    """Host entries with a socket read timeout that outlasts a blocking read.

    redis-py 8 defaults ``socket_timeout`` to 5 s, which breaks the blocking
    reads of ``channels_redis`` (django/channels_redis#422). A timeout left
    unset, or shorter than ``READ_TIMEOUT``, becomes ``READ_TIMEOUT``; an
    explicit ``None`` (wait forever) is kept.
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


def wire(event: dict) -> dict:
    """The event as the layer can encode it: a user's primary key that is not an int
    or a string (a UUID, say) travels as its string; consumers compare as strings."""
    user_id = event.get("_user_id")
    if user_id is None or isinstance(user_id, int | str):
        return event
    return {**event, "_user_id": str(user_id)}
