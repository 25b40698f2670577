"""Across processes over Redis: decision -> agent wake, gate -> socket, fan-out to 1,000 sockets.

Run: ``python bench/cross_process.py`` (``--quick`` for fewer trials). Needs
PostgreSQL and Redis: ``TOOLGATE_TEST_DATABASE_URL`` / ``TOOLGATE_TEST_REDIS_URL``
(or ``DATABASE_URL`` / ``REDIS_URL``); without them it says so and skips. It
creates a throwaway database on that PostgreSQL server, starts two daphne
processes (A and B) and one agent process with its own group prefix, and
removes all of it afterwards.

Figures (every process on this host; times from the shared monotonic clock):

* POST /api/inference/tool-confirm on server A -> the waiter in the agent
  process returns, p50/p99 (goal p50 <= 10 ms, p99 <= 30 ms); the same for a
  ``tool_confirm`` frame on a socket of server A;
* gate in the agent -> ``tool_start`` arrives on a socket of server B, p50/p99
  (goal p99 <= 30 ms); that socket is read by a client process of its own
  (``bench/_receiver.py``), which stamps each frame as it arrives;
* 1,000 sockets on server B, one call gated: time until the last socket has
  its ``tool_start`` (median of a few rounds).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import secrets
import signal
import sys
import time
from pathlib import Path
from urllib.parse import urlparse, urlunparse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))
from _common import figure, percentile, report, setup_django, skip  # noqa: E402

NAME = "cross_process"
MS = 1000.0


def _services() -> tuple[str | None, str | None]:
    db = os.environ.get("TOOLGATE_TEST_DATABASE_URL") or os.environ.get("DATABASE_URL")
    redis = os.environ.get("TOOLGATE_TEST_REDIS_URL") or os.environ.get("REDIS_URL")
    if db and not db.startswith(("postgres://", "postgresql://")):
        db = None
    return db, redis


def _with_database(url: str, name: str) -> str:
    return urlunparse(urlparse(url)._replace(path="/" + name))


def _admin_sql(url: str, sql: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql)


# -- the scenario ------------------------------------------------------------------

FAN_OUT = {"MAX_SOCKETS_PER_USER": 5000}


class Site:
    """Two servers, one agent, one signed-in person, on a throwaway database."""

    def __init__(self, db_url: str, redis_url: str) -> None:
        self.base_url = db_url
        self.db_name = f"toolgate_bench_{secrets.token_hex(4)}"
        self.prefix = f"tgbench{secrets.token_hex(4)}"
        self.redis_url = redis_url
        self.processes: list = []

    def __enter__(self) -> Site:
        _admin_sql(self.base_url, f'CREATE DATABASE "{self.db_name}"')
        try:
            self._start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _start(self) -> None:
        self.db_url = _with_database(self.base_url, self.db_name)
        os.environ.update(REDIS_URL=self.redis_url, TOOLGATE_GROUP_PREFIX=self.prefix)
        # Production-like settings, one key for this process (which signs the session) and
        # the servers (which read it).
        os.environ.update(DJANGO_DEBUG="0", DJANGO_SECRET_KEY="bench-" + secrets.token_hex(24))
        setup_django(self.db_url)
        from django.contrib.auth import get_user_model
        from django.test import Client

        from tests.procs import start_agent, start_daphne, wait_ready

        user = get_user_model().objects.create_user(f"bench-{secrets.token_hex(3)}")
        client = Client()
        client.force_login(user)
        self.user_id = user.pk
        self.sessionid = client.cookies["sessionid"].value
        env = {**os.environ, "DATABASE_URL": self.db_url}
        # One person holds the fan-out's 1,000 sockets: lift the per-user cap (20).
        self.a = start_daphne(env, approvals=FAN_OUT)
        self.processes.append(self.a)
        self.b = start_daphne(env, approvals=FAN_OUT)
        self.processes.append(self.b)
        wait_ready(self.a)
        wait_ready(self.b)
        self.agent = start_agent(env)
        self.processes.append(self.agent)

    def __exit__(self, *exc: object) -> None:
        for proc in reversed(self.processes):
            try:
                proc.stop()
            except Exception:
                pass
        try:
            from django.db import connections

            connections.close_all()
        except Exception:
            pass
        try:
            _admin_sql(self.base_url, f'DROP DATABASE IF EXISTS "{self.db_name}" WITH (FORCE)')
        except Exception as e:
            print(f"could not drop {self.db_name}: {e}")
        _forget_groups(self.redis_url, self.prefix)


def _forget_groups(redis_url: str, prefix: str) -> None:
    import redis

    r = redis.Redis.from_url(redis_url)
    try:
        for key in r.scan_iter(match=f"asgi:group:{prefix}*"):
            r.delete(key)
    finally:
        r.close()


def _socket(server, sessionid: str):
    from websockets.sync.client import connect

    from tests.procs import ws_headers

    sock = connect(server.ws_url, additional_headers=ws_headers(server, sessionid), proxy=None)
    assert json.loads(sock.recv(timeout=10))["type"] == "snapshot"
    return sock


def decide_latency(
    site: Site,
    trials: int,
    over: str,
    replies: list[float] | None = None,
    pause: tuple[float, float] | None = None,
) -> tuple[list[float], list[float]]:
    """Decision on A -> agent wakes; and, on the way, gate -> tool_start on B.

    B's socket is read in a process of its own (:mod:`_receiver`), which notes
    when each frame arrives; this process only drives the steps. ``pause``
    (seconds, low and high): a person's reading time between the card
    arriving and the click, drawn at random, so every process has gone quiet.
    """
    from _receiver import Receiver

    from tests.procs import HttpClient

    on_b = Receiver(site.b, site.sessionid)
    on_a = _socket(site.a, site.sessionid) if over == "websocket" else None
    http = HttpClient(site.a, site.sessionid) if over == "http" else None
    wakes, starts = [], []
    try:
        for i in range(trials + 3):
            gated = site.agent.gate_timed("bench", user_id=site.user_id)
            aid = gated["approval_id"]
            seen_on_b = on_b.arrival("tool_start", aid)
            if pause is not None:
                time.sleep(random.uniform(*pause))
            sent = time.monotonic()
            if http is not None:
                status, body = http.post_json(
                    "/api/inference/tool-confirm", {"approval_id": aid, "decision": "allow"}
                )
                assert status == 200 and body["resolved"], body
                replied = time.monotonic()
            elif on_a is not None:
                on_a.send(
                    json.dumps({"type": "tool_confirm", "approval_id": aid, "decision": "allow"})
                )
            else:  # the Python API in this process: the transport alone, no web request
                from approvals.gate import resolve_tool_decision

                assert resolve_tool_decision(aid, "allow")
            woke = site.agent.answer(aid)["t"]
            if i >= 3:  # the first calls warm connections and caches
                wakes.append(woke - sent)
                if http is not None and replies is not None:
                    replies.append(replied - sent)
                starts.append(seen_on_b - gated["t0"])
    finally:
        on_b.close()
        for closable in (on_a, http):
            if closable is not None:
                closable.close()
    return wakes, starts


async def _watch(sock, box: dict, arrived: list, done: asyncio.Event, total: int) -> None:
    """Read ``sock`` until the round's ``tool_start`` comes; note when."""
    while True:
        raw = await sock.recv()
        # A substring test, not json.loads: this process reads 1,000 sockets on
        # a shared CPU, and its own parsing would be most of what is measured.
        if box["aid"] in raw and '"tool_start"' in raw:
            arrived.append(time.monotonic())
            if len(arrived) == total:
                done.set()
            return


async def _fan_out_round(site: Site, socks: list) -> float:
    loop = asyncio.get_running_loop()
    box = {"aid": secrets.token_urlsafe(24)}
    arrived: list[float] = []
    done = asyncio.Event()
    watchers = [asyncio.create_task(_watch(s, box, arrived, done, len(socks))) for s in socks]
    gated = await loop.run_in_executor(
        None,
        lambda: site.agent.gate_timed("fanout", user_id=site.user_id, approval_id=box["aid"]),
    )
    await asyncio.wait_for(done.wait(), 30)
    await asyncio.gather(*watchers)
    return max(arrived) - gated["t0"]


def fan_out(site: Site, clients: int, rounds: int) -> tuple[list[float], float]:
    """``clients`` sockets on B; each round gates one call and times the last arrival."""
    from websockets.asyncio.client import connect

    from tests.procs import ws_headers

    async def main() -> tuple[list[float], float]:
        limit = asyncio.Semaphore(50)
        headers = ws_headers(site.b, site.sessionid)

        async def one():
            async with limit:
                sock = await connect(
                    site.b.ws_url, additional_headers=headers, proxy=None, open_timeout=60
                )
                first = json.loads(await sock.recv())
                assert first["type"] == "snapshot", first
                return sock

        t0 = time.monotonic()
        socks = await asyncio.gather(*(one() for _ in range(clients)))
        connect_seconds = time.monotonic() - t0
        try:
            rounds_taken = [await _fan_out_round(site, socks) for _ in range(rounds)]
            return rounds_taken, connect_seconds
        finally:
            await asyncio.gather(*(s.close() for s in socks), return_exceptions=True)

    return asyncio.run(main())


def _raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer trials and rounds")
    parser.add_argument("--clients", type=int, default=1000)
    args = parser.parse_args()
    db, redis = _services()
    if not db or not redis:
        skip(
            NAME,
            "needs PostgreSQL and Redis: set TOOLGATE_TEST_DATABASE_URL and "
            "TOOLGATE_TEST_REDIS_URL (or DATABASE_URL and REDIS_URL)",
        )
        return
    _raise_fd_limit()
    # Stopped from outside (a CI timeout): still stop the servers and drop the database.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    trials = 40 if args.quick else 200
    started = time.monotonic()
    with Site(db, redis) as site:
        replies: list[float] = []
        http_wakes, starts = decide_latency(site, trials, "http", replies)
        ws_wakes, more_starts = decide_latency(site, trials, "websocket")
        api_wakes, _ = decide_latency(site, trials, "python")
        fan, connect_seconds = fan_out(site, args.clients, 2 if args.quick else 5)
    starts += more_starts
    p = dict(
        http50=percentile(http_wakes, 50) * MS,
        http99=percentile(http_wakes, 99) * MS,
        reply50=percentile(replies, 50) * MS,
        api50=percentile(api_wakes, 50) * MS,
        api99=percentile(api_wakes, 99) * MS,
        ws50=percentile(ws_wakes, 50) * MS,
        ws99=percentile(ws_wakes, 99) * MS,
        start50=percentile(starts, 50) * MS,
        start99=percentile(starts, 99) * MS,
        fan=percentile(fan, 50) * MS,
    )
    figures = {
        "post_wake_p50": figure(
            p["http50"], "ms", "POST on A -> agent wakes, p50", "<= 10 ms", p["http50"] <= 10
        ),
        "post_wake_p99": figure(
            p["http99"], "ms", "POST on A -> agent wakes, p99", "<= 30 ms", p["http99"] <= 30
        ),
        "post_reply_p50": figure(p["reply50"], "ms", "POST on A -> its 200 response, p50"),
        "ws_wake_p50": figure(p["ws50"], "ms", "tool_confirm on A -> agent wakes, p50"),
        "ws_wake_p99": figure(p["ws99"], "ms", "tool_confirm on A -> agent wakes, p99"),
        "api_wake_p50": figure(
            p["api50"], "ms", "resolve_tool_decision in another process -> agent wakes, p50"
        ),
        "api_wake_p99": figure(
            p["api99"], "ms", "resolve_tool_decision in another process -> agent wakes, p99"
        ),
        "start_p50": figure(p["start50"], "ms", "gate -> tool_start on B, p50"),
        "start_p99": figure(
            p["start99"], "ms", "gate -> tool_start on B, p99", "<= 30 ms", p["start99"] <= 30
        ),
        "fanout_last": figure(
            p["fan"], "ms", f"gate -> last of {args.clients} sockets on one daphne has it"
        ),
        "fanout_connect": figure(connect_seconds, "s", f"connecting {args.clients} sockets"),
    }
    notes = [
        f"{trials} decisions each way (HTTP, WebSocket, Python API)",
        f"fan-out rounds {[round(x * MS, 1) for x in fan]} ms",
        f"took {time.monotonic() - started:.0f} s; load average {os.getloadavg()[0]:.1f}",
    ]
    report(NAME, figures, notes)


if __name__ == "__main__":
    main()
