"""Waiting: how one gated call sleeps in this process until its answer, and cancel hooks.

A :class:`Slot` is registered for an approval before its row is written.
Whoever learns the outcome (the deciding thread after commit, the process
listener on a channel-layer message, the database re-check) calls
:meth:`Slot.set`; a sync waiter blocked on a threading primitive or an async
waiter awaiting a future wakes at once. Cancellation wakes it the same way,
through a hook on the caller's ``threading.Event`` / ``asyncio.Event``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from ._compat import hook_event_set

#: What a woken waiter finds when it was cancelled rather than decided.
INTERRUPTED = "interrupted"


class Slot:
    """One waiting tool call in this process."""

    __slots__ = ("approval_id", "expires_at", "_status", "_interrupted", "_event", "_futures")

    def __init__(self, approval_id: str, expires_at: datetime | None = None) -> None:
        self.approval_id = approval_id
        self.expires_at = expires_at
        self._status: str | None = None
        self._interrupted = False
        # Made on the first sync wait: an async waiter never needs one (~1 KiB each).
        self._event: threading.Event | None = None
        self._futures: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = []

    def __repr__(self) -> str:
        return f"<Slot {self.approval_id} {self._status or 'waiting'}>"

    @property
    def status(self) -> str | None:
        """The final status once known, else ``None``."""
        return self._status

    def set(self, status: str) -> None:
        """Record the outcome and wake the waiter (first outcome sticks; thread-safe)."""
        if self._status is not None:
            return
        self._status = status
        self._wake(status)

    def interrupt(self) -> None:
        """Wake the waiter because its caller cancelled (thread-safe)."""
        if self._status is None and not self._interrupted:
            self._interrupted = True
            self._wake(INTERRUPTED)

    def _wake(self, value: str) -> None:
        with _EVENT_LOCK:
            event = self._event
        if event is not None:
            event.set()
        for loop, fut in list(self._futures):
            try:
                loop.call_soon_threadsafe(settle, fut, value)
            except RuntimeError:  # that loop has closed
                pass

    def wait(self, timeout: float | None) -> str | None:
        """Block up to ``timeout`` seconds; return the status, ``INTERRUPTED`` or ``None``."""
        with _EVENT_LOCK:
            if self._event is None:
                self._event = threading.Event()
                if self._result() is not None:  # woken before anyone waited
                    self._event.set()
            event = self._event
        event.wait(timeout)
        return self._result()

    def future(self) -> asyncio.Future:
        """A future in the running loop that resolves like :meth:`wait`."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._futures.append((loop, fut))
        result = self._result()
        if result is not None:
            settle(fut, result)
        return fut

    def _result(self) -> str | None:
        if self._status is not None:
            return self._status
        return INTERRUPTED if self._interrupted else None


_EVENT_LOCK = threading.Lock()


def settle(fut: asyncio.Future, value: str | None) -> None:
    """Resolve ``fut`` with ``value`` unless it is done (cancelled, or settled first)."""
    if not fut.done():
        fut.set_result(value)


_HOOKS = "_toolgate_set_hooks"


def on_set(event: Any, callback: Callable[[], None]) -> Callable[[], None]:
    """Call ``callback`` once, from the setting thread, when ``event`` is set.

    No polling for the two kinds of event the gate accepts. A
    ``threading.Event`` gets its condition wrapped, so every ``set()`` reaches
    the hook, even through a bound method taken earlier (``Timer(1, ev.set)``).
    An ``asyncio.Event`` is watched by a task on its loop when one is running
    here, else its ``set`` is wrapped. Anything else with ``is_set()`` falls
    back to a 10 ms watcher thread. Returns a function that removes the hook.
    """
    if event is None:
        return _noop
    fired = threading.Event()

    def once() -> None:
        if not fired.is_set():
            fired.set()
            callback()

    if isinstance(event, threading.Event):
        remove = hook_event_set(event, once)
    elif isinstance(event, asyncio.Event):
        remove = _hook_asyncio_event(event, once)
    else:
        return _watch_by_polling(event, once, fired)
    if event.is_set():
        once()
    return remove


def _hook_asyncio_event(event: asyncio.Event, once: Callable[[], None]) -> Callable[[], None]:
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    if loop is not None:
        task = loop.create_task(event.wait())
        task.add_done_callback(lambda t: None if t.cancelled() else once())
        return task.cancel
    hooks = event.__dict__.get(_HOOKS)
    if hooks is None:
        hooks = []
        original = event.set

        def set_and_notify() -> None:
            original()
            for hook in list(hooks):
                hook()

        event.__dict__[_HOOKS] = hooks
        event.set = set_and_notify
    hooks.append(once)
    return lambda: _discard(hooks, once)


def _discard(hooks: list, item: Any) -> None:
    try:
        hooks.remove(item)
    except ValueError:
        pass


def _watch_by_polling(event: Any, once: Callable[[], None], fired: threading.Event):
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set() and not fired.is_set():
            if event.is_set():
                once()
                return
            time.sleep(0.01)

    threading.Thread(target=watch, name="toolgate-cancel-watch", daemon=True).start()
    return stop.set


def _noop() -> None:
    return None
