"""A few long-lived threads for Django's synchronous request work under ASGI.

Django runs each ASGI request's synchronous parts (sync middleware, the
session and user reads, sync views) in a thread-sensitive context of its own,
which asgiref serves with a new thread per request; every request then opens
a new database connection on that thread (``CONN_MAX_AGE`` cannot keep what
the next request never sees). Here each request is given one of a few
single-thread executors that live as long as the process: threads and
database connections are reused, and Django's own request signals still check
each connection's health before and after every request.

Requests sharing an executor run their synchronous parts one after another,
as they would on one core anyway. ``DJANGO_ASGI_THREADS`` sets how many
(default 4). With an asgiref too old to accept an executor (before 3.9) the
application is served as Django made it.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import ThreadSensitiveContext


class PooledThreads:
    """Wraps Django's ASGI application: each request on the least busy of a few threads."""

    def __init__(self, app, size: int) -> None:
        self.app = app
        self.executors = [
            ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"django-sync-{i}")
            for i in range(size)
        ]
        self.busy = [0] * size

    @classmethod
    def wrap(cls, app):
        try:
            ThreadSensitiveContext(executor=None)
        except TypeError:  # asgiref < 3.9
            return app
        size = int(os.environ.get("DJANGO_ASGI_THREADS") or 4)
        return cls(app, size) if size > 0 else app

    async def __call__(self, scope, receive, send):
        index = min(range(len(self.busy)), key=self.busy.__getitem__)
        self.busy[index] += 1
        try:
            async with ThreadSensitiveContext(executor=self.executors[index]):
                await self.app(scope, receive, send)
        finally:
            self.busy[index] -= 1
