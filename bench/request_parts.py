"""Where an HTTP decision's time goes: daphne's CPU per request, part by part, by thread.

Run: ``python bench/request_parts.py`` (``--calls N`` per kind and round,
``--rounds N``). One daphne process serves the site on a temporary SQLite
database, as in bench/http_load.py; 50 clients in a process of their own
(bench/_loadgen.py) send, in turn, the trivial GET and then requests that add
one part of a decision at a time:

* ``ping``: ``GET /bench/ping``, nothing read (http_load's trivial request);
* ``user``: ``GET /bench/user``, the session and the user read;
* ``releases``: ``GET /bench/releases``, nothing read, but the interpreter lock
  released 12 times around ~3 µs of C work each, as three SQLite statements
  release it: what the lock changing hands costs while the event loop waits
  for it (against ``ping``, whose work is the same but for those 36 µs);
* ``post``: ``POST /bench/post``, a JSON body read and parsed, no session;
* ``signed-post``: ``POST /bench/signed-post`` through the decision endpoint's
  decorator: signed in, CSRF checked, body bounded and parsed, nothing decided;
* ``decide``: ``POST /api/inference/tool-confirm``, a real decision.

For each: requests per second, and daphne's CPU per request split between the
event loop's thread (HTTP, ASGI, Django's handler and its hand-offs to
threads) and the request threads (sync middleware, the view, the database),
read from ``/proc/<pid>/task/*/stat`` before and after each round (Linux only),
and daphne's context switches per request (``/proc/<pid>/task/*/status``):
each database statement lets the interpreter lock change hands, and each
change is a switch or two. Also the CPU daphne's garbage collector spent per
request (``/bench/gc``), and its full collections and longest collection
over the whole run (``toolgate_site.collector``; ``DJANGO_ASGI_GC_FREEZE=0
DJANGO_ASGI_GC_THRESHOLD=0`` for Python's own settings, the baseline).
Before each kind's clock starts, the server gets half a second and 100
untimed trivial requests, so that what one kind leaves behind (its garbage to
collect, say) is not charged to the next. Medians over the rounds. The
figures show which part of a decision costs what, next to a trivial request
in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, child_env, cpu_by_name, figure, report, setup_django, thread_cpu  # noqa: E402

sys.path.insert(0, str(ROOT))
MS = 1000.0
KINDS = {
    "ping": ("GET", "/bench/ping"),
    "user": ("GET", "/bench/user"),
    "releases": ("GET", "/bench/releases"),
    "post": ("POST", "/bench/post"),
    "signed-post": ("POST", "/bench/signed-post"),
    "decide": ("POST", None),
}


def thread_counts(pid: int) -> tuple[float, float, int, int]:
    """CPU seconds of ``pid``'s main thread (the event loop) and of all its other
    threads, then their context switches (voluntary and not), from ``/proc``."""
    tick = os.sysconf("SC_CLK_TCK")
    main = other = 0.0
    main_sw = other_sw = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            raw = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
            status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        except OSError:
            continue  # the thread ended meanwhile
        fields = raw[raw.rindex(")") + 2 :].split()
        seconds = (int(fields[11]) + int(fields[12])) / tick
        switches = sum(
            int(line.split()[1]) for line in status.splitlines() if "ctxt_switches" in line
        )
        if tid == str(pid):
            main += seconds
            main_sw += switches
        else:
            other += seconds
            other_sw += switches
    return main, other, main_sw, other_sw


def by_name(server, before: dict[str, float], after: dict[str, float], calls: int) -> dict:
    """Milliseconds of CPU per request for each named thread (``/bench/threads``), the
    request threads together."""
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/bench/threads", timeout=10) as r:
        names = json.load(r)
    for tid, name in names.items():
        if name.startswith(("ThreadPoolExecutor", "django-sync-")):
            names[tid] = "request threads"
    return cpu_by_name(names, before, after, MS / calls)


def collections(server) -> dict:
    """What daphne's garbage collector has done so far (``/bench/gc``)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/bench/gc", timeout=10) as r:
        return json.load(r)


def measure(calls: int, rounds: int, clients: int) -> dict[str, dict[str, float]]:
    from django.contrib.auth import get_user_model
    from django.test import Client
    from http_load import Agent, _load

    from tests.procs import start_daphne, wait_ready

    user = get_user_model().objects.create_user(f"parts-{os.getpid()}")
    web = Client()
    web.force_login(user)
    sessionid = web.cookies["sessionid"].value
    env = child_env(os.environ["DATABASE_URL"])
    env["DJANGO_SETTINGS_MODULE"] = "bench._http_settings"
    env.pop("REDIS_URL", None)
    server = wait_ready(start_daphne(env))
    agent = Agent()
    samples: dict[str, list[tuple[float, ...]]] = {kind: [] for kind in KINDS}
    named: dict[str, list[dict]] = {kind: [] for kind in KINDS}
    try:
        _load(server, sessionid, clients, kind="trivial", count=200)  # warm up
        for _ in range(rounds):
            for kind, (method, path) in KINDS.items():
                job: dict = {"kind": "trivial", "count": calls, "method": method, "path": path}
                if path is None:
                    job = {"kind": "decide", "ids": agent.gate(calls, user)}
                # What the previous kind left the server to do (collecting its garbage,
                # say) is done before this kind's clock starts, not charged to it.
                time.sleep(0.5)
                _load(server, sessionid, clients, kind="trivial", count=100)
                gc0 = collections(server)
                before = thread_counts(server.proc.pid)
                tids = thread_cpu(server.proc.pid)
                seconds = _load(server, sessionid, clients, **job)["seconds"]
                after = thread_counts(server.proc.pid)
                named[kind].append(by_name(server, tids, thread_cpu(server.proc.pid), calls))
                gc1 = collections(server)
                per_call = [(a - b) / calls for a, b in zip(after, before, strict=True)]
                collected = (sum(gc1["cpu"]) - sum(gc0["cpu"])) / calls
                samples[kind].append((calls / seconds, *per_call, collected))
        whole = collections(server)
    finally:
        server.stop()
    return {
        kind: {
            "rate": statistics.median(s[0] for s in rows),
            "loop_ms": statistics.median(s[1] for s in rows) * MS,
            "threads_ms": statistics.median(s[2] for s in rows) * MS,
            "switches": statistics.median(s[3] + s[4] for s in rows),
            "gc_ms": statistics.median(s[5] for s in rows) * MS,
            "collector": whole,
            "by_thread": _median_by_name(named[kind]),
        }
        for kind, rows in samples.items()
    }


def _median_by_name(rounds: list[dict]) -> dict[str, float]:
    names = {name for spent in rounds for name in spent}
    return {name: statistics.median(spent.get(name, 0.0) for spent in rounds) for name in names}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls")
    parser.add_argument("--calls", type=int, default=None, help="requests per kind and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=50)
    opts = parser.parse_args()
    calls = opts.calls or (300 if opts.quick else 1500)
    os.environ.pop("REDIS_URL", None)
    os.environ.setdefault("TOOLGATE_GROUP_PREFIX", f"parts{os.getpid()}")
    setup_django()
    parts = measure(calls, opts.rounds, opts.clients)
    figures = {}
    for kind, r in parts.items():
        key = kind.replace("-", "_")
        figures[f"{key}_per_s"] = figure(r["rate"], "/s", f"{kind}: requests/s")
        figures[f"{key}_loop_cpu_ms"] = figure(
            r["loop_ms"], "ms", f"{kind}: daphne CPU per request, event loop thread"
        )
        figures[f"{key}_threads_cpu_ms"] = figure(
            r["threads_ms"], "ms", f"{kind}: daphne CPU per request, request threads"
        )
        figures[f"{key}_switches"] = figure(
            r["switches"], "", f"{kind}: daphne context switches per request, all threads"
        )
        figures[f"{key}_gc_ms"] = figure(
            r["gc_ms"], "ms", f"{kind}: daphne's garbage collections, CPU per request"
        )
    whole = parts["ping"]["collector"]
    figures["full_collections"] = figure(
        whole["count"][2], "", "daphne's full collections over the whole run"
    )
    figures["full_collections_cpu_ms"] = figure(
        whole["cpu"][2] * MS, "ms", "daphne's full collections over the whole run, CPU in all"
    )
    figures["longest_collection_ms"] = figure(
        whole["longest"] * MS, "ms", "daphne's longest garbage collection"
    )
    notes = []
    for kind, r in parts.items():
        spent = sorted(r["by_thread"].items(), key=lambda item: -item[1])
        shown = ", ".join(f"{name} {ms:.3f}" for name, ms in spent if ms >= 0.005)
        notes.append(f"{kind}: daphne CPU per request by thread, ms: {shown}")
    share = parts["decide"]["rate"] / parts["ping"]["rate"] * 100
    figures["decide_share"] = figure(share, "%", "decide: requests/s as a share of ping's")
    report(
        "request parts",
        figures,
        [
            f"{calls} requests per kind and round, {opts.rounds} rounds (medians), "
            f"{opts.clients} clients, one daphne process, SQLite, no Redis",
            f"load average {os.getloadavg()[0]:.1f} at the end",
            *notes,
        ],
    )


if __name__ == "__main__":
    main()
