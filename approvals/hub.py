"""The fan-out hub: the process listener's events, handed to the sockets of one event loop.

One listener subscription and one thread hop per event and loop, however many
sockets the loop serves; each event is encoded for clients once, and queued
only for sockets that may show it.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from typing import Any

from . import events
from . import listener as listener_module
from .listener import Listener

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


def _nothing() -> None:
    return None
