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
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import ThreadSensitiveContext

#: Seconds one piece of synchronous work may run before new requests go elsewhere.
STALLED_AFTER = 0.02


def _hot_default() -> int:
    """1 on SQLite (no round trips to wait on; one writer anyway), 2 on a database server."""
    from django.conf import settings

    engine = settings.DATABASES.get("default", {}).get("ENGINE", "")
    return 1 if engine.endswith("sqlite3") else 2


class _Lane(ThreadPoolExecutor):
    """A one-thread executor that knows since when its current work has run."""

    def __init__(self, name: str) -> None:
        super().__init__(max_workers=1, thread_name_prefix=name)
        self.busy = 0  # requests given this lane and not finished
        self.running_since: float | None = None

    def submit(self, fn, /, *args, **kwargs):
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

    def __init__(self, app, size: int, hot: int = 1) -> None:
        self.app = app
        self.lanes = [_Lane(f"django-sync-{i}") for i in range(size)]
        self.hot = max(1, min(hot, size))

    @classmethod
    def wrap(cls, app):
        try:
            ThreadSensitiveContext(executor=None)
        except TypeError:  # asgiref < 3.9
            return app
        size = int(os.environ.get("DJANGO_ASGI_THREADS") or 4)
        hot = int(os.environ.get("DJANGO_ASGI_HOT_THREADS") or _hot_default())
        return cls(app, size, hot) if size > 0 else app

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
        lane = self.choose()
        lane.busy += 1
        try:
            async with ThreadSensitiveContext(executor=lane):
                await self.app(scope, receive, send)
        finally:
            lane.busy -= 1
