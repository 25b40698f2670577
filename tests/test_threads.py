"""toolgate_site.threads: one hot request thread, others only when it is stuck."""

from __future__ import annotations

import asyncio
import threading

import pytest
from asgiref.sync import sync_to_async

from toolgate_site import threads
from toolgate_site.threads import PooledThreads


def _app(work):
    """An ASGI app that runs ``work(scope)`` twice in sync code and records the threads."""

    async def app(scope, receive, send):
        first = await sync_to_async(work)(scope)
        second = await sync_to_async(work)(scope)
        scope["threads"] = (first, second)

    return app


def _name(scope):
    gate = scope.get("gate")
    if gate is not None:
        gate.wait(10)
    return threading.current_thread().name


async def _request(pool, **scope):
    scope = {"type": "http", **scope}
    await pool(scope, None, None)
    return scope["threads"]


def test_quick_requests_share_the_first_thread():
    pool = PooledThreads(_app(_name), 3)

    async def run():
        return await asyncio.gather(*(_request(pool) for _ in range(20)))

    seen = asyncio.run(run())
    assert {name for pair in seen for name in pair} == {"django-sync-0_0"}
    assert [lane.busy for lane in pool.lanes] == [0, 0, 0]


def test_a_request_goes_elsewhere_while_the_first_thread_is_stuck(monkeypatch):
    monkeypatch.setattr(threads, "STALLED_AFTER", 0.05)
    pool = PooledThreads(_app(_name), 3)
    gate = threading.Event()

    async def run():
        slow = asyncio.ensure_future(_request(pool, gate=gate))
        await asyncio.sleep(0.01)
        early = pool.choose()  # stuck for less than STALLED_AFTER: still the first
        await asyncio.sleep(0.1)
        quick = await asyncio.wait_for(_request(pool), 5)  # finishes while slow waits
        assert not slow.done()
        gate.set()
        return early, quick, await slow

    early, quick, slow = asyncio.run(run())
    assert early is pool.lanes[0]
    assert slow == ("django-sync-0_0", "django-sync-0_0")
    assert quick == ("django-sync-1_0", "django-sync-1_0")  # one thread per request


def test_all_stuck_picks_the_lane_with_fewest_requests(monkeypatch):
    monkeypatch.setattr(threads, "STALLED_AFTER", 0.0)
    pool = PooledThreads(_app(_name), 2)
    for lane in pool.lanes:
        lane.running_since = 0.0
    pool.lanes[0].busy = 3
    pool.lanes[1].busy = 1
    assert pool.choose() is pool.lanes[1]


def test_zero_threads_serves_the_application_unchanged(monkeypatch):
    app = _app(_name)
    monkeypatch.setenv("DJANGO_ASGI_THREADS", "0")
    assert PooledThreads.wrap(app) is app
    monkeypatch.setenv("DJANGO_ASGI_THREADS", "2")
    wrapped = PooledThreads.wrap(app)
    assert isinstance(wrapped, PooledThreads) and len(wrapped.lanes) == 2


def test_an_error_in_the_work_still_frees_the_lane():
    def boom(scope):
        raise RuntimeError("boom")

    pool = PooledThreads(_app(boom), 2)
    with pytest.raises(RuntimeError):
        asyncio.run(_request(pool))
    assert pool.lanes[0].running_since is None and pool.lanes[0].busy == 0


def test_hot_lanes_share_the_requests_and_the_rest_wait_for_a_stall(monkeypatch):
    monkeypatch.setattr(threads, "STALLED_AFTER", 0.05)
    pool = PooledThreads(_app(_name), 4, hot=2)
    gates = [threading.Event(), threading.Event()]

    async def run():
        slow = [asyncio.ensure_future(_request(pool, gate=gate)) for gate in gates]
        await asyncio.sleep(0.01)
        spread = {pool.lanes.index(pool.choose())}  # both hot lanes have one request
        await asyncio.sleep(0.1)  # both hot lanes now stuck
        quick = await asyncio.wait_for(_request(pool), 5)
        for gate in gates:
            gate.set()
        return spread, quick, await asyncio.gather(*slow)

    spread, quick, slow = asyncio.run(run())
    assert {pair[0] for pair in slow} == {"django-sync-0_0", "django-sync-1_0"}
    assert spread <= {0, 1}
    assert quick == ("django-sync-2_0", "django-sync-2_0")


def test_the_hot_lanes_default_by_database(monkeypatch):
    from django.conf import settings

    monkeypatch.delenv("DJANGO_ASGI_HOT_THREADS", raising=False)
    monkeypatch.delenv("DJANGO_ASGI_THREADS", raising=False)
    app = _app(_name)
    monkeypatch.setattr(settings, "DATABASES", {"default": {"ENGINE": "x.sqlite3"}})
    assert PooledThreads.wrap(app).hot == 1
    monkeypatch.setattr(settings, "DATABASES", {"default": {"ENGINE": "x.postgresql"}})
    assert PooledThreads.wrap(app).hot == 2
    monkeypatch.setenv("DJANGO_ASGI_HOT_THREADS", "3")
    assert PooledThreads.wrap(app).hot == 3
