"""A few long-lived threads for Django's synchronous request work under ASGI.

Django runs each ASGI request's synchronous parts (sync middleware, the
session and user reads, sync views) in a thread-sensitive context of its own,
which asgiref serves with a new thread per request; every request then opens
a new database connection on that thread (``CONN_MAX_AGE`` cannot keep what
the next request never sees). Here each request is given one of a few
single-thread executors that live as long as the process: threads and
database connections are reused, and Django's own request signals still check
each connection's health before and after every request.

**One hot thread, the others for when it is stuck.** Python runs one thread at
a time, so spreading quick requests over several threads only adds the cost of
handing the interpreter lock between them (and, on SQLite, writers sleeping in
the busy handler behind each other): one daphne process served both trivial
requests and decisions faster on one thread than on four. So new requests
share the first thread on SQLite, and the first two on a database server
(one can run while the other waits on a round trip; ``DJANGO_ASGI_HOT_THREADS``
sets it), unless these have been running one piece of work for longer than
``STALLED_AFTER`` (an export, a slow query): then a new request goes to the
next thread that is not stuck, so one slow request does not hold up the
others. A request keeps its thread to the end, as Django's thread-sensitive
code expects. ``DJANGO_ASGI_THREADS`` sets how many
threads there are at most (default 4; 0 serves the application as Django made
it). With an asgiref too old to accept an executor (before 3.9) the
application is served as Django made it.

**With one hot thread, the event loop waits for it, briefly.** While a request
thread works, the event loop's thread wants the interpreter lock too (to read
the next requests), and takes it each time the request thread lets it go:
around every database statement, each time a context switch or two. With one
hot thread there is nowhere to send the next request meanwhile, so when the
loop's thread hands a piece of synchronous work to a request thread, it waits
for that work to finish, up to ``DJANGO_ASGI_LOOP_WAIT_MS`` (default 5 with
one hot thread; 0, never, with more) before it goes back to the loop; work
that runs longer is awaited as before. The wait also ends at once when
another thread hands the loop something (``call_soon_threadsafe``: an
``async_to_sync`` in a view, an event for a WebSocket). Network input waits
meanwhile, as it would for the lock. Requests that read the database cost
less this way, a trivial one that reads nothing a little more (figures in
docs/scaling.md).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor

from asgiref.sync import ThreadSensitiveContext

#: Seconds one piece of synchronous work may run before new requests go elsewhere.
STALLED_AFTER = 0.02
#: Milliseconds the loop waits for a request thread by default, with one hot thread.
LOOP_WAIT_MS = 5


def _hot_default() -> int:
    """1 on SQLite (no round trips to wait on; one writer anyway), 2 on a database server."""
    from django.conf import settings

    engine = settings.DATABASES.get("default", {}).get("ENGINE", "")
    return 1 if engine.endswith("sqlite3") else 2


class LoopWait:
    """The event loop's thread waiting for work it handed to a request thread: until
    the work is done, another thread hands the loop something, or ``seconds`` pass."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        # Per joined loop, the wait under way on its thread (a one-item list), if any.
        self._waits: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def join(self, loop: asyncio.AbstractEventLoop) -> None:
        """Let what other threads hand ``loop`` end a wait at once. A loop that
        cannot be joined so (uvloop's, say) never waits."""
        try:
            if loop in self._waits:
                return
        except TypeError:  # cannot be weakly referenced
            return
        handoff = loop.call_soon_threadsafe
        waiting: list[threading.Event | None] = [None]

        def call_soon_threadsafe(callback, *args, **kwargs):
            handle = handoff(callback, *args, **kwargs)
            waking = waiting[0]
            if waking is not None:
                waking.set()
            return handle

        try:
            loop.call_soon_threadsafe = call_soon_threadsafe
        except AttributeError:  # a loop type without instance attributes
            return
        self._waits[loop] = waiting

    def submit(self, lane: ThreadPoolExecutor, fn, /, *args, **kwargs) -> Future:
        """``lane.submit(fn, ...)``; from a joined loop's own thread, then wait for it."""
        try:
            waiting = self._waits.get(asyncio.get_running_loop())
        except RuntimeError:  # no loop runs in this thread
            waiting = None
        if waiting is None:
            return ThreadPoolExecutor.submit(lane, fn, *args, **kwargs)
        waking = threading.Event()
        waiting[0] = waking  # before the work starts: it may hand the loop something
        try:
            future = ThreadPoolExecutor.submit(lane, fn, *args, **kwargs)
            future.add_done_callback(lambda _done: waking.set())
            waking.wait(self.seconds)
        finally:
            waiting[0] = None
        return future


class _Lane(ThreadPoolExecutor):
    """A one-thread executor that knows since when its current work has run."""

    def __init__(self, name: str, loop_wait: LoopWait | None = None) -> None:
        super().__init__(max_workers=1, thread_name_prefix=name)
        self.busy = 0  # requests given this lane and not finished
        self.running_since: float | None = None
        self.loop_wait = loop_wait

    def submit(self, fn, /, *args, **kwargs):
        if self.loop_wait is not None:
            return self.loop_wait.submit(self, self._timed, fn, *args, **kwargs)
        return super().submit(self._timed, fn, *args, **kwargs)

    def _timed(self, fn, *args, **kwargs):
        self.running_since = time.monotonic()
        try:
            return fn(*args, **kwargs)
        finally:
            self.running_since = None

    def stalled(self, now: float) -> bool:
        since = self.running_since
        return since is not None and now - since > STALLED_AFTER


class PooledThreads:
    """Wraps Django's ASGI application: each request on a hot thread that is not stuck."""

    def __init__(self, app, size: int, hot: int = 1, loop_wait_ms: float = 0) -> None:
        self.app = app
        self.loop_wait = LoopWait(loop_wait_ms / 1000) if loop_wait_ms > 0 else None
        self.lanes = [_Lane(f"django-sync-{i}", self.loop_wait) for i in range(size)]
        self.hot = max(1, min(hot, size))

    @classmethod
    def wrap(cls, app):
        try:
            ThreadSensitiveContext(executor=None)
        except TypeError:  # asgiref < 3.9
            return app
        size = int(os.environ.get("DJANGO_ASGI_THREADS") or 4)
        hot = int(os.environ.get("DJANGO_ASGI_HOT_THREADS") or _hot_default())
        wait = os.environ.get("DJANGO_ASGI_LOOP_WAIT_MS")
        wait_ms = float(wait) if wait else (LOOP_WAIT_MS if hot == 1 else 0)
        return cls(app, size, hot, wait_ms) if size > 0 else app

    def choose(self) -> _Lane:
        """The hot lane with fewest requests that is not stuck, else the first other
        lane not stuck; if all are stuck, the one with fewest requests."""
        now = time.monotonic()
        hot = [lane for lane in self.lanes[: self.hot] if not lane.stalled(now)]
        if hot:
            return min(hot, key=lambda lane: lane.busy)
        for lane in self.lanes[self.hot :]:
            if not lane.stalled(now):
                return lane
        return min(self.lanes, key=lambda lane: lane.busy)

    async def __call__(self, scope, receive, send):
        if self.loop_wait is not None:
            self.loop_wait.join(asyncio.get_running_loop())
        lane = self.choose()
        lane.busy += 1
        try:
            async with ThreadSensitiveContext(executor=lane):
                await self.app(scope, receive, send)
        finally:
            lane.busy -= 1
