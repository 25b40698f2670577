"""Across processes without Redis: the database watchers (SQLite data_version, PostgreSQL NOTIFY).

Run: ``python bench/cross_nobroker.py`` (``--quick`` for fewer trials). Always
measures SQLite (a temp file); measures PostgreSQL too when
``TOOLGATE_TEST_DATABASE_URL`` (or a postgres ``DATABASE_URL``) is set, on a
throwaway database. No channel layer: ``REDIS_URL`` is unset for every process,
and the re-check is a minute apart, so only the watcher carries events.

Figures: gate in the agent -> ``tool_start`` on a socket of server B (read by
a client process of its own, ``bench/_receiver.py``); a
``tool_confirm`` frame on server A -> the agent process wakes; POST on A ->
the agent wakes. On SQLite also ``make demo``'s case: a click (``tool_confirm``)
after a person's pause of 0.6-1.2 s, when every watcher has gone quiet -> the
agent wakes. Then the idle CPU of a server holding sockets and of an agent
process holding waiters, over 10 s with nothing happening (goal < 1 % of a core).
Goals (issue 14): SQLite p50 <= 30 ms and p99 <= 100 ms both ways;
PostgreSQL decision -> agent p50 <= 10 ms, p99 <= 30 ms, gate -> tool_start p99 <= 30 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import figure, percentile, remove_sqlite, report, setup_django  # noqa: E402
from cross_process import MS, Site, _admin_sql, _services, _with_database, decide_latency  # noqa: E402

NAME = "cross_nobroker"
SLOW = {"RECHECK_INTERVAL": 60.0}
#: A person's reading time before each click of the paused run (seconds, low and high).
PAUSE = (0.6, 1.2)


class QuietSite(Site):
    """Site without Redis; ``db_url`` None means a temp SQLite file."""

    def __init__(self, pg_url: str | None) -> None:
        super().__init__(pg_url or "", "")
        self.pg = pg_url is not None

    def __enter__(self) -> QuietSite:
        if self.pg:
            _admin_sql(self.base_url, f'CREATE DATABASE "{self.db_name}"')
        try:
            self._start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _start(self) -> None:
        from django.contrib.auth import get_user_model
        from django.test import Client

        from tests.procs import start_agent, start_daphne, wait_ready

        os.environ.pop("REDIS_URL", None)
        os.environ.update(TOOLGATE_GROUP_PREFIX=self.prefix, DJANGO_DEBUG="0")
        os.environ.setdefault("DJANGO_SECRET_KEY", "bench-" + secrets.token_hex(24))
        self.db_url = setup_django(_with_database(self.base_url, self.db_name) if self.pg else None)
        user = get_user_model().objects.create_user(f"bench-{secrets.token_hex(3)}")
        client = Client()
        client.force_login(user)
        self.user_id = user.pk
        self.sessionid = client.cookies["sessionid"].value
        env = {**os.environ, "DATABASE_URL": self.db_url}
        for name in ("a", "b"):
            server = start_daphne(env, approvals=SLOW)
            self.processes.append(server)
            setattr(self, name, server)
        wait_ready(self.a)
        wait_ready(self.b)
        self.agent = start_agent(env, approvals=SLOW)
        self.processes.append(self.agent)

    def __exit__(self, *exc: object) -> None:
        for proc in reversed(self.processes):
            try:
                proc.stop()
            except Exception:
                pass
        from django.db import connections

        connections.close_all()
        if self.pg:
            _admin_sql(self.base_url, f'DROP DATABASE IF EXISTS "{self.db_name}" WITH (FORCE)')
        elif getattr(self, "db_url", None):
            remove_sqlite(self.db_url)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_cpu(site: QuietSite, seconds: float) -> tuple[float, float]:
    """Percent of a core used by server B (10 sockets) and the agent (10 waiters), idle."""
    from websockets.sync.client import connect

    from tests.procs import ws_headers

    socks = [
        connect(site.b.ws_url, additional_headers=ws_headers(site.b, site.sessionid), proxy=None)
        for _ in range(10)
    ]
    aids = [site.agent.gate("idle", user_id=site.user_id) for _ in range(10)]
    time.sleep(1.0)
    pids = (site.b.proc.pid, site.agent.proc.pid)
    before = [_cpu_seconds(p) for p in pids]
    time.sleep(seconds)
    used = [(_cpu_seconds(p) - b) / seconds * 100 for p, b in zip(pids, before, strict=True)]
    from approvals.gate import resolve_tool_decision

    for aid in aids:
        resolve_tool_decision(aid, "deny")
    for sock in socks:
        sock.close()
    return used[0], used[1]


def run(label: str, pg_url: str | None, trials: int, goals: dict) -> tuple[dict, list]:
    paused: list[float] = []
    with QuietSite(pg_url) as site:
        ws, starts = decide_latency(site, trials, "websocket")
        post, more = decide_latency(site, trials, "http")
        if not pg_url:  # make demo: SQLite, a person reading each card before the click
            paused, _ = decide_latency(site, trials // 4, "websocket", pause=PAUSE)
        server_cpu, agent_cpu = idle_cpu(site, 10.0)
    starts += more
    wakes = ws + post
    w50, w99 = percentile(wakes, 50) * MS, percentile(wakes, 99) * MS
    s50, s99 = percentile(starts, 50) * MS, percentile(starts, 99) * MS
    g = goals
    figures = {
        f"{label}_wake_p50": figure(
            w50,
            "ms",
            f"{label}: decision on A -> agent wakes, p50",
            g["w50"][0],
            w50 <= g["w50"][1],
        ),
        f"{label}_wake_p99": figure(
            w99,
            "ms",
            f"{label}: decision on A -> agent wakes, p99",
            g["w99"][0],
            w99 <= g["w99"][1],
        ),
        f"{label}_start_p50": figure(
            s50,
            "ms",
            f"{label}: gate -> tool_start on B, p50",
            g["s50"][0],
            s50 <= g["s50"][1] if g["s50"][0] else None,  # PostgreSQL: no goal for p50
        ),
        f"{label}_start_p99": figure(
            s99, "ms", f"{label}: gate -> tool_start on B, p99", g["s99"][0], s99 <= g["s99"][1]
        ),
        f"{label}_idle_server": figure(
            server_cpu, "%", f"{label}: idle server with 10 sockets, CPU", "< 1 %", server_cpu < 1
        ),
        f"{label}_idle_agent": figure(
            agent_cpu, "%", f"{label}: idle agent with 10 waiters, CPU", "< 1 %", agent_cpu < 1
        ),
    }
    notes = [f"{label}: {len(wakes)} decisions (WebSocket and POST), {len(starts)} gates"]
    if paused:
        figures.update(_paused_figures(label, paused, g))
        notes.append(
            f"{label}: {len(paused)} clicks (tool_confirm) each after a pause of "
            f"{PAUSE[0]}-{PAUSE[1]} s, as make demo's person makes them"
        )
    return figures, notes


def _paused_figures(label: str, paused: list[float], g: dict) -> dict:
    p50, p99 = percentile(paused, 50) * MS, percentile(paused, 99) * MS
    what = f"{label}: click after a person's pause -> agent wakes"
    return {
        f"{label}_paused_wake_p50": figure(
            p50, "ms", f"{what}, p50", g["w50"][0], p50 <= g["w50"][1]
        ),
        f"{label}_paused_wake_p99": figure(
            p99, "ms", f"{what}, p99", g["w99"][0], p99 <= g["w99"][1]
        ),
    }


SQLITE_GOALS = {
    k: ("<= 30 ms", 30) if k.endswith("50") else ("<= 100 ms", 100)
    for k in ("w50", "w99", "s50", "s99")
}
PG_GOALS = {
    "w50": ("<= 10 ms", 10),
    "w99": ("<= 30 ms", 30),
    "s50": ("", 1e9),
    "s99": ("<= 30 ms", 30),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer trials")
    parser.add_argument("--part", choices=["sqlite", "postgresql"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    trials = 30 if args.quick else 150
    if args.part:  # one database per process: Django is set up once per process
        db, _ = _services()
        goals = PG_GOALS if args.part == "postgresql" else SQLITE_GOALS
        figures, notes = run(args.part, db if args.part == "postgresql" else None, trials, goals)
        print(json.dumps({"figures": figures, "notes": notes}))
        return
    started = time.monotonic()
    figures, notes = {}, []
    parts = ["sqlite"] + (["postgresql"] if _services()[0] else [])
    for part in parts:
        cmd = [sys.executable, __file__, "--part", part] + (["--quick"] if args.quick else [])
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        got = json.loads(out.strip().splitlines()[-1])
        figures.update(got["figures"])
        notes += got["notes"]
    if "postgresql" not in parts:
        notes.append("PostgreSQL skipped: set TOOLGATE_TEST_DATABASE_URL")
    notes.append(f"took {time.monotonic() - started:.0f} s; load average {os.getloadavg()[0]:.1f}")
    report(NAME, figures, notes)


if __name__ == "__main__":
    main()
