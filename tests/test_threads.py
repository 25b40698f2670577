"""toolgate_site.threads: one hot request thread, others only when it is stuck."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from asgiref.sync import async_to_sync, sync_to_async

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


def _ticking(seconds):
    """A sync piece of work of ``seconds``, and a loop ticker: how many times the event
    loop ran while the work ran."""
    ticks = []

    def work(scope):
        start = len(ticks)
        time.sleep(seconds)
        return len(ticks) - start

    async def ticker(stop):
        while not stop.is_set():
            ticks.append(1)
            await asyncio.sleep(0)

    return work, ticker


def _run_with_ticker(pool, ticker):
    async def run():
        stop = asyncio.Event()
        ticking = asyncio.ensure_future(ticker(stop))
        await asyncio.sleep(0)
        try:
            return await asyncio.wait_for(_request(pool), 10)
        finally:
            stop.set()
            await ticking

    return asyncio.run(run())


def test_the_loop_waits_for_short_work_on_a_request_thread():
    work, ticker = _ticking(0.02)
    waited = PooledThreads(_app(work), 2, hot=1, loop_wait_ms=1000)
    assert _run_with_ticker(waited, ticker) == (0, 0)  # the loop did not run meanwhile
    work, ticker = _ticking(0.02)
    free = PooledThreads(_app(work), 2, hot=1, loop_wait_ms=0)
    assert free.loop_wait is None
    assert min(_run_with_ticker(free, ticker)) > 0


def test_the_loop_waits_no_longer_than_its_budget():
    work, ticker = _ticking(0.5)
    pool = PooledThreads(_app(work), 2, hot=1, loop_wait_ms=20)
    assert min(_run_with_ticker(pool, ticker)) > 0  # the loop ran again within the work


def test_a_hand_off_to_the_loop_ends_the_wait():
    """async_to_sync in the work needs the loop: it is not kept waiting for the budget."""

    async def on_the_loop():
        await asyncio.sleep(0)
        return threading.current_thread().name

    def work(scope):
        return async_to_sync(on_the_loop)()

    pool = PooledThreads(_app(work), 2, hot=1, loop_wait_ms=60_000)
    started = time.monotonic()
    assert asyncio.run(asyncio.wait_for(_request(pool), 30)) == ("MainThread", "MainThread")
    assert time.monotonic() - started < 20  # far below the 60 s budget


def test_only_the_loops_own_thread_waits():
    pool = PooledThreads(_app(_name), 2, hot=1, loop_wait_ms=60_000)
    asyncio.run(_request(pool))  # joins that loop
    gate = threading.Event()
    submitted = threading.Event()

    def from_a_plain_thread():
        pool.lanes[0].submit(gate.wait, 30)
        submitted.set()

    helper = threading.Thread(target=from_a_plain_thread)
    helper.start()
    assert submitted.wait(10)  # returned while the work still waits on the gate
    gate.set()
    helper.join(10)


def test_the_loop_wait_defaults_by_hot_threads(monkeypatch):
    monkeypatch.delenv("DJANGO_ASGI_LOOP_WAIT_MS", raising=False)
    monkeypatch.delenv("DJANGO_ASGI_THREADS", raising=False)
    app = _app(_name)
    monkeypatch.setenv("DJANGO_ASGI_HOT_THREADS", "1")
    assert PooledThreads.wrap(app).loop_wait.seconds == threads.LOOP_WAIT_MS / 1000
    monkeypatch.setenv("DJANGO_ASGI_HOT_THREADS", "2")
    assert PooledThreads.wrap(app).loop_wait is None
    monkeypatch.setenv("DJANGO_ASGI_LOOP_WAIT_MS", "3")
    assert PooledThreads.wrap(app).loop_wait.seconds == 0.003
    monkeypatch.setenv("DJANGO_ASGI_HOT_THREADS", "1")
    monkeypatch.setenv("DJANGO_ASGI_LOOP_WAIT_MS", "0")
    assert PooledThreads.wrap(app).loop_wait is None
