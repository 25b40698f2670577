"""Decisions per second through HTTP against one daphne process, 50 concurrent clients.

Run: ``python bench/http_load.py`` (``--quick``, ``--clients N``, ``--calls N``,
``--redis URL`` to add the scaled run). One daphne process serves the site on
a temporary SQLite database; this process is the agent: it gates every call
first (async waiters, one event loop), then 50 client threads, each on its own
keep-alive connection with a signed-in session and CSRF token, POST
``/api/inference/tool-confirm`` as fast as the server answers. The clients
run in a process of their own (bench/_loadgen.py): sharing this process's
interpreter lock with thousands of waking waiters would slow them in the
decision rounds only. Trivial GETs and
decisions alternate in three rounds of a third of the calls each, and each
rate is the total over its rounds.

With ``TOOLGATE_TEST_DATABASE_URL`` (or ``--postgres URL``) the same run
follows on a throwaway PostgreSQL database, no Redis.

Reported: decisions per second (all answered 200) and as a share of the same
server's rate on a trivial JSON view (goal >= 70 %), daphne's CPU per request,
the HTTP round trip p50/p99, and the wake latency p50/p99: POST sent -> the
agent's waiter returns in this process (without Redis through the database
watchers, with ``--redis`` through the channel layer).

After the SQLite run, the same run again with the server reading sessions and
users through Django's own session engine and ``ModelBackend``: the baseline
for the site's ``approvals.sessions`` and ``approvals.backends``, measured in
the same invocation; and once more served by Django's own ASGI handler
(``DJANGO_ASGI_ONE_HOP=0``): the baseline for ``toolgate_site.onehop``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
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
ROUNDS = 3  # trivial GETs and decisions alternate, this many times each
DJANGO_BACKEND = "django.contrib.auth.backends.ModelBackend"


class Agent:
    """Async waiters for many gated calls in one loop thread; records when each wakes."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.woke: dict[str, tuple[float, str]] = {}
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def gate(self, n: int, user) -> list[str]:
        from approvals import gate

        aids = []
        for i in range(n):
            aid = gate.new_approval_id()
            slot = gate.begin_tool_decision(f"load-{i % 20}", aid, user=user, tool_name="shell")
            asyncio.run_coroutine_threadsafe(self._wait(slot, aid), self.loop)
            aids.append(aid)
        return aids

    async def _wait(self, slot, aid: str) -> None:
        from approvals import gate

        answer = await gate.await_tool_decision(slot, aid)
        self.woke[aid] = (time.monotonic(), answer)


def _load(server, sessionid: str, clients: int, **job) -> dict:
    """Run one round of HTTP load from bench/_loadgen.py, in a process of its own."""
    job.update(port=server.port, origin=server.origin, sessionid=sessionid, clients=clients)
    done = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("_loadgen.py"))],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    result = json.loads(done.stdout)
    if result["failed"]:
        failed, examples = result["failed"], result["failures"]
        raise RuntimeError(f"{failed} {job['kind']} requests failed, e.g. {examples}")
    return result


def drive(server, sessionid: str, aids: list[str], clients: int) -> tuple[dict, list, float]:
    """POST a decision for every id from ``clients`` connections; send times, RTTs, seconds."""
    result = _load(server, sessionid, clients, kind="decide", ids=aids)
    return result["sent"], result["rtts"], result["seconds"]


def trivial(server, sessionid: str, count: int, clients: int) -> float:
    """GET the trivial JSON view ``count`` times from ``clients`` connections; requests/s."""
    return count / _load(server, sessionid, clients, kind="trivial", count=count)["seconds"]


def run_mode(
    label: str,
    redis_url: str | None,
    calls: int,
    clients: int,
    django_auth: bool = False,
    django_handler: bool = False,
) -> dict:
    """One server, one agent, ``calls`` decisions; the figures for this mode.

    ``django_auth``: the server reads sessions and users with Django's own
    session engine and ``ModelBackend`` (the baseline for the site's
    ``approvals.sessions`` and ``approvals.backends``). ``django_handler``: it
    serves requests with Django's own ASGI handler (``DJANGO_ASGI_ONE_HOP=0``),
    the baseline for ``toolgate_site.onehop``.
    """
    from django.contrib.auth import get_user_model
    from django.test import Client

    from tests.procs import start_daphne, wait_ready

    user = get_user_model().objects.create_user(f"load-{label}-{os.getpid()}")
    web = Client()
    web.force_login(user, backend=DJANGO_BACKEND if django_auth else None)
    env = child_env(os.environ["DATABASE_URL"])
    env["DJANGO_SETTINGS_MODULE"] = "bench._http_settings"  # adds /bench/ping
    if django_auth:
        env["TOOLGATE_BENCH_DJANGO_AUTH"] = "1"
    if django_handler:
        env["DJANGO_ASGI_ONE_HOP"] = "0"
    env.pop("REDIS_URL", None)
    if redis_url:
        env["REDIS_URL"] = redis_url
    server = wait_ready(start_daphne(env))
    sent: dict = {}
    rtts: list = []
    seconds = ping_seconds = server_cpu = trivial_cpu = 0.0
    try:
        agent = Agent()
        aids = agent.gate(calls, user)
        time.sleep(1.0)
        sessionid = web.cookies["sessionid"].value
        trivial(server, sessionid, 200, clients)  # warm up
        rss0 = rss_of(server.proc.pid)
        # Alternating rounds, so that a neighbour's burst or the machine's drift
        # lands on both kinds of request rather than on one of them.
        for index in range(ROUNDS):
            chunk = aids[index::ROUNDS]
            tag = f"{label}-" if index == 0 else None
            cpu_t = cpu_of(server.proc.pid)
            with _profiled(server.proc.pid, tag and f"{tag}trivial"):
                ping_seconds += len(chunk) / trivial(server, sessionid, len(chunk), clients)
            cpu_d = cpu_of(server.proc.pid)
            with _profiled(server.proc.pid, tag and f"{tag}decisions"):
                round_sent, round_rtts, round_seconds = drive(server, sessionid, chunk, clients)
            cpu_e = cpu_of(server.proc.pid)
            trivial_cpu += cpu_d - cpu_t
            server_cpu += cpu_e - cpu_d
            sent.update(round_sent)
            rtts += round_rtts
            seconds += round_seconds
        deadline = time.monotonic() + 10
        while len(agent.woke) < len(aids) and time.monotonic() < deadline:
            time.sleep(0.05)
        rss1 = rss_of(server.proc.pid)
    finally:
        server.stop()
    ping_rate = len(aids) / ping_seconds
    wakes = [agent.woke[a][0] - sent[a] for a in aids if a in agent.woke]
    return {
        "rate": len(aids) / seconds,
        "ping_rate": ping_rate,
        "rtt": rtts,
        "wake": wakes,
        "lost": len(aids) - len(wakes) + sum(agent.woke[a][1] != "allow" for a in agent.woke),
        "rss_growth": rss1 - rss0,
        "server_cpu_ms": server_cpu / len(aids) * MS,
        "trivial_cpu_ms": trivial_cpu / len(aids) * MS,
    }


def mode_figures(label: str, where: str, r: dict) -> dict:
    """The figures of one mode (``where`` names it in the labels)."""
    ratio = r["rate"] / r["ping_rate"]
    figures = {
        f"{label}_decisions_per_s": figure(r["rate"], "/s", f"decisions/s ({where})"),
        f"{label}_trivial_per_s": figure(
            r["ping_rate"], "/s", f"trivial JSON GETs/s, same server ({where})"
        ),
        f"{label}_decision_ratio": figure(
            ratio * 100,
            "%",
            f"decisions/s as a share of trivial GETs/s ({where})",
            ">= 70 %",
            ratio >= 0.7,
        ),
        f"{label}_rtt_p50_ms": figure(
            percentile(r["rtt"], 50) * MS, "ms", f"HTTP round trip p50 ({where})"
        ),
        f"{label}_rtt_p99_ms": figure(
            percentile(r["rtt"], 99) * MS, "ms", f"HTTP round trip p99 ({where})"
        ),
        f"{label}_wake_p50_ms": figure(
            percentile(r["wake"], 50) * MS, "ms", f"wake p50, POST -> agent ({where})"
        ),
        f"{label}_wake_p99_ms": figure(
            percentile(r["wake"], 99) * MS, "ms", f"wake p99, POST -> agent ({where})"
        ),
        f"{label}_lost": figure(r["lost"], "", f"decisions lost ({where})", "= 0"),
        f"{label}_server_cpu_ms": figure(
            r["server_cpu_ms"], "ms", f"daphne CPU per decision ({where})"
        ),
        f"{label}_trivial_cpu_ms": figure(
            r["trivial_cpu_ms"], "ms", f"daphne CPU per trivial GET ({where})"
        ),
        f"{label}_server_rss_growth_mib": figure(
            r["rss_growth"], "MiB", f"daphne RSS growth over the run ({where})"
        ),
    }
    figures[f"{label}_lost"]["met"] = r["lost"] == 0
    return figures


def baseline_figures(r: dict) -> dict:
    """The same SQLite run with Django's own session engine and ModelBackend."""
    where = "SQLite, Django's own session engine and ModelBackend"
    return {
        "djangoauth_decisions_per_s": figure(r["rate"], "/s", f"decisions/s ({where})"),
        "djangoauth_decision_ratio": figure(
            r["rate"] / r["ping_rate"] * 100,
            "%",
            f"decisions/s as a share of trivial GETs/s ({where})",
        ),
        "djangoauth_server_cpu_ms": figure(
            r["server_cpu_ms"], "ms", f"daphne CPU per decision ({where})"
        ),
    }


def handler_figures(plain: dict, ours: dict, db: str = "SQLite", prefix: str = "") -> dict:
    """The same run served by Django's own ASGI handler, and the speed-ups."""
    where = f"{db}, Django's own ASGI handler"
    return {
        f"{prefix}djangohandler_decisions_per_s": figure(
            plain["rate"], "/s", f"decisions/s ({where})"
        ),
        f"{prefix}djangohandler_trivial_per_s": figure(
            plain["ping_rate"], "/s", f"trivial JSON GETs/s ({where})"
        ),
        f"{prefix}onehop_decision_speedup": figure(
            ours["rate"] / plain["rate"], "x", f"decisions/s, one hand-off / Django's ({db})"
        ),
        f"{prefix}onehop_trivial_speedup": figure(
            ours["ping_rate"] / plain["ping_rate"],
            "x",
            f"trivial GETs/s, one hand-off / Django's ({db})",
        ),
    }


def postgresql_part(base_url: str, calls: int, clients: int) -> None:
    """The PostgreSQL mode, in a process of its own (Django is set up once per process):
    a throwaway database, no Redis; prints its figures as one JSON line."""
    import secrets

    from cross_process import _admin_sql, _with_database

    name = f"toolgate_bench_http_{secrets.token_hex(4)}"
    _admin_sql(base_url, f'CREATE DATABASE "{name}"')
    try:
        setup_django(_with_database(base_url, name))
        r = run_mode("postgresql", None, calls, clients)
        figures = mode_figures("postgresql", "PostgreSQL, no Redis", r)
        plain = run_mode("pghandler", None, calls, clients, django_handler=True)
        figures.update(handler_figures(plain, r, "PostgreSQL", "postgresql_"))
        print(json.dumps(figures))
    finally:
        from django.db import connections

        connections.close_all()
        _admin_sql(base_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls")
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--calls", type=int, default=None, help="decisions (default 3000)")
    parser.add_argument("--redis", default=os.environ.get("REDIS_URL"), help="add a Redis run")
    parser.add_argument(
        "--postgres",
        default=_postgres_url(),
        help="add a PostgreSQL run on a throwaway database (default TOOLGATE_TEST_DATABASE_URL)",
    )
    parser.add_argument("--part", choices=["postgresql"], help=argparse.SUPPRESS)
    opts = parser.parse_args()
    calls = opts.calls or (600 if opts.quick else 3000)
    os.environ.pop("REDIS_URL", None)  # this process: the embedded default first
    os.environ.setdefault("TOOLGATE_GROUP_PREFIX", f"bench{os.getpid()}")
    if opts.part:
        postgresql_part(opts.postgres, calls, opts.clients)
        return
    database_url = setup_django()
    try:
        figures: dict = {}
        modes = [("sqlite", None)] + ([("redis", opts.redis)] if opts.redis else [])
        for label, redis_url in modes:
            if redis_url:
                _switch_to_redis(redis_url)
            r = run_mode(label, redis_url, calls, opts.clients)
            where = "SQLite, no Redis" if not redis_url else "SQLite + Redis"
            figures.update(mode_figures(label, where, r))
            if label == "sqlite":
                base = run_mode("djangoauth", None, calls, opts.clients, django_auth=True)
                figures.update(baseline_figures(base))
                plain = run_mode("djangohandler", None, calls, opts.clients, django_handler=True)
                figures.update(handler_figures(plain, r))
        notes = [
            f"{calls} calls gated in this process, then decided by {opts.clients} concurrent "
            "keep-alive HTTP clients against one daphne process",
        ]
        if opts.postgres:
            cmd = [sys.executable, __file__, "--part", "postgresql", "--calls", str(calls)]
            cmd += ["--clients", str(opts.clients), "--postgres", opts.postgres]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            figures.update(json.loads(out.strip().splitlines()[-1]))
        else:
            notes.append("PostgreSQL skipped: set TOOLGATE_TEST_DATABASE_URL or --postgres")
        if not opts.redis:
            notes.append("no Redis given (--redis or REDIS_URL): only the embedded run")
        notes.append(f"load average {os.getloadavg()[0]:.1f} at the end")
        report("http load", figures, notes)
    finally:
        remove_sqlite(database_url)


@contextlib.contextmanager
def _profiled(pid: int, name: str | None):
    """With ``TOOLGATE_BENCH_PROFILE=DIR``, py-spy records daphne meanwhile (raw stacks,
    ``DIR/<name>.txt``): where a decision's time goes, next to a trivial request's.
    Only the first round is recorded (``name`` is None for the others).
    ``TOOLGATE_BENCH_PROFILE_FLAGS`` replaces py-spy's ``--gil`` (say
    ``--threads``, to see every thread that is not idle, by name)."""
    out_dir = os.environ.get("TOOLGATE_BENCH_PROFILE")
    if not out_dir or not name:
        yield
        return
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    cmd = [
        "py-spy",
        "record",
        *os.environ.get("TOOLGATE_BENCH_PROFILE_FLAGS", "--gil").split(),
        "-p",
        str(pid),
        "-r",
        "250",
        "-f",
        "raw",
        "-o",
    ]
    spy = subprocess.Popen([*cmd, f"{out_dir}/{name}.txt"], stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)
        spy.wait(30)


def _postgres_url() -> str | None:
    url = os.environ.get("TOOLGATE_TEST_DATABASE_URL") or os.environ.get("DATABASE_URL") or ""
    return url if url.startswith(("postgres://", "postgresql://")) else None


def _switch_to_redis(url: str) -> None:
    """Point this process's channel layer (and so its listener) at Redis."""
    from channels.layers import channel_layers
    from django.conf import settings

    from approvals import listener

    listener.shutdown()
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [url], "capacity": 1000, "expiry": 30},
        }
    }
    channel_layers.backends.clear()


if __name__ == "__main__":
    main()
