"""Soak: 1,000 WebSocket clients, 100 gated calls per second, for 60 seconds.

Run: ``python bench/soak.py`` (``--seconds N`` to shorten, ``--redis URL`` to
run the scaled way; default: the embedded one, SQLite and no Redis). One
daphne process serves the site on a temporary SQLite database. An agent
process (``tests/procs.py``) gates ``--rate`` calls per second for 50 users;
1,000 sockets (20 per user) watch them, and the first socket of each user
answers every ``tool_start`` it sees with a ``tool_confirm``.

Reported: decisions lost (a call gated, answered on a socket, whose agent
never got that answer; must be 0), calls never answered, wake p50/p99
(``tool_confirm`` sent -> the agent's waiter returns), ``tool_start``
deliveries missing on the 1,000 sockets, and daphne's RSS growth from the
first to the last second of the run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    ROOT,
    child_env,
    cpu_of,
    figure,
    percentile,
    remove_sqlite,
    report,
    rss_of,
    setup_django,
)

sys.path.insert(0, str(ROOT))
MS = 1000.0
USERS = 50


class Watchers:
    """The sockets: what each saw, and when each decider answered."""

    def __init__(self) -> None:
        self.starts: dict[str, int] = {}
        self.decided_at: dict[str, float] = {}
        self.decision: dict[str, str] = {}
        self.closed = 0


async def watch(url: str, headers: dict, decider: bool, seen: Watchers) -> None:
    from websockets.asyncio.client import connect

    async with connect(url, additional_headers=headers, proxy=None, open_timeout=60) as sock:
        first = json.loads(await sock.recv())
        assert first["type"] == "snapshot"
        seen.ready += 1
        try:
            while True:  # until cancelled
                raw = await sock.recv()
                if '"tool_start"' not in raw:
                    continue
                message = json.loads(raw)
                aid = message["approval_id"]
                seen.starts[aid] = seen.starts.get(aid, 0) + 1
                if decider and message["awaiting_confirmation"]:
                    answer = "allow" if zlib.crc32(aid.encode()) % 2 else "deny"
                    seen.decision[aid] = answer
                    seen.decided_at[aid] = time.monotonic()
                    frame = {"type": "tool_confirm", "approval_id": aid, "decision": answer}
                    await sock.send(json.dumps(frame))
        except asyncio.CancelledError:
            raise
        except Exception:
            seen.closed += 1
            raise


async def soak(
    server, agent, users: list, idle: list, clients: int, active: int, rate: float, seconds: float
) -> dict:
    from tests.procs import ws_headers

    seen = Watchers()
    seen.ready = 0
    tasks = []
    for i in range(clients):
        if i < active:
            user_id, sessionid = users[i % len(users)]
        else:  # sockets of people with no calls: the server must not pay for them per event
            user_id, sessionid = idle[i % len(idle)]
        tasks.append(
            asyncio.create_task(
                watch(server.ws_url, ws_headers(server, sessionid), i < len(users), seen)
            )
        )
        if i % 50 == 49:
            await asyncio.sleep(0.05)
    while seen.ready < clients:
        await asyncio.sleep(0.1)
        if any(t.done() for t in tasks):
            raise RuntimeError([t.exception() for t in tasks if t.done()][:3])
    await asyncio.sleep(1.0)
    rss_start, cpu_start = rss_of(server.proc.pid), cpu_of(server.proc.pid)
    gated = 0
    t0 = time.monotonic()
    while (elapsed := time.monotonic() - t0) < seconds:
        due = int(elapsed * rate) + 1
        while gated < due:
            user_id = users[gated % len(users)][0]
            agent.send(
                op="gate",
                session_id=f"soak-{gated % 200}",
                approval_id=f"soak{gated:07d}",
                user_id=user_id,
            )
            gated += 1
        await asyncio.sleep(0.005)
    rss_end = rss_of(server.proc.pid)
    cpu = 100 * (cpu_of(server.proc.pid) - cpu_start) / (time.monotonic() - t0)
    drain = await _drain(agent, seen, gated)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return {
        "seen": seen,
        "gated": gated,
        "rss_growth": rss_end - rss_start,
        "drain": drain,
        "cpu": cpu,
    }


async def _drain(agent, seen: Watchers, gated: int, quiet: float = 15.0, most: float = 120.0):
    """Wait until every answered call reached its agent, or nothing moved for ``quiet`` s."""
    start = last_change = time.monotonic()
    last = -1
    while time.monotonic() - start < most:
        answered = sum(1 for line in list(agent.lines) if line.get("event") == "answer")
        if answered >= gated:
            break
        if answered != last:
            last, last_change = answered, time.monotonic()
        elif time.monotonic() - last_change > quiet:
            break
        await asyncio.sleep(0.2)
    return time.monotonic() - start


def tally(result: dict, agent, active: int) -> dict:
    seen: Watchers = result["seen"]
    answers = {}
    for line in list(agent.lines):
        if line.get("event") == "answer":
            answers[line["approval_id"]] = line
    aids = [f"soak{i:07d}" for i in range(result["gated"])]
    per_user = active // USERS
    decided = [a for a in aids if a in seen.decision]
    lost = [a for a in decided if answers.get(a, {}).get("answer") != seen.decision[a]]
    wakes = [answers[a]["t"] - seen.decided_at[a] for a in decided if a in answers]
    missing = sum(max(0, per_user - seen.starts.get(a, 0)) for a in aids)
    return {
        "lost": len(lost),
        "unanswered": len(aids) - len(decided),
        "wake": wakes,
        "missing_starts": missing,
        "closed": seen.closed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=100.0, help="gated calls per second")
    parser.add_argument(
        "--active", type=int, default=None, help="sockets of users with calls (default: all)"
    )
    parser.add_argument("--redis", default=None, help="run with this Redis (default: no Redis)")
    opts = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 8192)), hard))
    os.environ.pop("REDIS_URL", None)
    os.environ.setdefault("TOOLGATE_GROUP_PREFIX", f"soak{os.getpid()}")
    database_url = setup_django()
    try:
        run(opts, database_url)
    finally:
        remove_sqlite(database_url)


def run(opts: argparse.Namespace, database_url: str) -> None:
    from django.contrib.auth import get_user_model
    from django.test import Client

    from tests.procs import start_agent, start_daphne, wait_ready

    users, idle = [], []
    for i in range(2 * USERS):
        user = get_user_model().objects.create_user(f"soak{i}")
        client = Client()
        client.force_login(user)
        (users if i < USERS else idle).append((user.pk, client.cookies["sessionid"].value))
    active = opts.clients if opts.active is None else min(opts.active, opts.clients)
    env = child_env(database_url)
    env.pop("REDIS_URL", None)
    if opts.redis:
        env["REDIS_URL"] = opts.redis
    server = wait_ready(start_daphne(env))
    agent = start_agent(env)
    try:
        result = asyncio.run(
            soak(server, agent, users, idle, opts.clients, active, opts.rate, opts.seconds)
        )
        t = tally(result, agent, active)
    finally:
        agent.stop()
        server.stop()
    where = "SQLite + Redis" if opts.redis else "SQLite, no Redis"
    f = {
        "lost": figure(t["lost"], "", "decisions lost", "= 0", t["lost"] == 0),
        "gated": figure(result["gated"], "calls", "calls gated"),
        "unanswered": figure(t["unanswered"], "calls", "calls no socket answered"),
        "wake_p50_ms": figure(percentile(t["wake"], 50) * MS, "ms", "wake p50, confirm -> agent"),
        "wake_p99_ms": figure(percentile(t["wake"], 99) * MS, "ms", "wake p99, confirm -> agent"),
        "missing_starts": figure(t["missing_starts"], "", "tool_start deliveries missing"),
        "sockets_dropped": figure(t["closed"], "", "sockets that failed"),
        "server_rss_growth_mib": figure(result["rss_growth"], "MiB", "daphne RSS growth"),
        "server_cpu_percent": figure(result["cpu"], "% of a core", "daphne CPU while gating"),
        "drain_s": figure(
            result["drain"], "s", "after the last call: until every agent had its answer"
        ),
    }
    notes = [
        f"{opts.seconds:.0f} s, {opts.clients} sockets ({active} of them signed in as the "
        f"{USERS} users with calls), "
        f"{opts.rate:.0f} calls/s "
        f"gated by one agent process, one daphne process, {where}",
    ]
    if not opts.redis:
        notes.append(
            "without Redis a confirm reaches the agent process through the database "
            "re-check (RECHECK_INTERVAL 1 s), which sets the wake figures"
        )
    report("soak", f, notes)


if __name__ == "__main__":
    main()
