"""The gate in one process: wake and cancel latency, and what 10,000 waiters cost.

Run: ``python bench/gate.py`` (``--quick`` for a shorter run). Uses a new
temporary SQLite file database with the site's settings (WAL, IMMEDIATE
transactions) and no Redis, migrated first; every decision writes its audit row.

Figures:

* wake latency, resolve -> waiter returns (sync thread waiter, async future
  waiter), p50/p99, including the conditional UPDATE of the audit row; the
  async trials again with ``SQLITE_CHECKPOINTS`` off (each commit that fills
  the WAL copies it back itself, SQLite's default): the baseline for the
  listener's checkpoint thread (:mod:`approvals.walcheck`);
* cancel latency, cancel signal -> waiter returns (including the ``cancelled``
  write), for a ``threading.Event``, an ``asyncio.Event`` and ``task.cancel()``;
* 10,000 pending async waiters: RSS above the baseline and CPU while idle,
  also split by thread (a note: the re-check, the watcher, the outbox worker...);
* the same for a thread-per-waiter gate that polls every 0.5 s (the original
  in-process design, reimplemented here in a few lines) with 5,000 waiters,
  and its cancel median; ratios against toolgate.

The memory/idle sections each run in a fresh child process of this run, so
both start from the same baseline (Django set up, migrated, one call decided).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import queue
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import figure, percentile, remove_sqlite, report, setup_django  # noqa: E402
from _gate_idle import run_child, section_threads, section_toolgate, warm_up  # noqa: E402

MS = 1000.0


# -- same-process latency ---------------------------------------------------


def wake_sync(n: int) -> list[float]:
    """Resolve from this thread; a waiting thread returns. Seconds per trial."""
    from approvals import gate

    jobs: queue.Queue = queue.Queue()
    ready = threading.Event()
    returned: list[float] = []

    def waiter() -> None:
        while (job := jobs.get()) is not None:
            slot, aid = job
            ready.set()
            gate.wait_tool_decision(slot, aid)
            returned.append(time.perf_counter())

    t = threading.Thread(target=waiter, daemon=True)
    t.start()
    out = []
    for _ in range(n):
        aid = gate.new_approval_id()
        slot = gate.begin_tool_decision("bench", aid, tool_name="shell", arguments={"cmd": "ls"})
        ready.clear()
        jobs.put((slot, aid))
        ready.wait()
        time.sleep(0.001)  # let the waiter block
        before = len(returned)
        t0 = time.perf_counter()
        assert gate.resolve_tool_decision(aid, "allow", "bench")
        while len(returned) == before:
            time.sleep(0)
        out.append(returned[-1] - t0)
    jobs.put(None)
    t.join()
    return out


async def _wake_async(n: int) -> list[float]:
    from approvals import gate

    pool = ThreadPoolExecutor(1)  # the "web request" thread that decides
    loop = asyncio.get_running_loop()
    out = []
    starts: list[float] = []

    def resolve(aid: str) -> None:
        starts.append(time.perf_counter())
        assert gate.resolve_tool_decision(aid, "deny", "bench")

    for _ in range(n):
        aid = gate.new_approval_id()
        slot = await loop.run_in_executor(
            pool, lambda a=aid: gate.begin_tool_decision("bench", a, tool_name="shell")
        )
        task = loop.create_task(gate.await_tool_decision(slot, aid))
        await asyncio.sleep(0.001)
        loop.run_in_executor(pool, resolve, aid)
        assert await task == "deny"
        out.append(time.perf_counter() - starts[-1])
    pool.shutdown()
    return out


def cancel_sync(n: int) -> list[float]:
    """Set a threading.Event; the waiting thread returns (``cancelled`` recorded)."""
    from approvals import gate

    out = []
    for _ in range(n):
        aid = gate.new_approval_id()
        slot = gate.begin_tool_decision("bench", aid, tool_name="shell")
        cancel = threading.Event()
        box: list[float] = []
        t = threading.Thread(
            target=lambda s=slot, a=aid, c=cancel, b=box: (
                gate.wait_tool_decision(s, a, c),
                b.append(time.perf_counter()),
            )
        )
        t.start()
        time.sleep(0.002)
        t0 = time.perf_counter()
        cancel.set()
        t.join()
        out.append(box[0] - t0)
    return out


async def _cancel_async(n: int, how: str) -> list[float]:
    from approvals import gate

    loop = asyncio.get_running_loop()
    pool = ThreadPoolExecutor(1)
    out = []
    for _ in range(n):
        aid = gate.new_approval_id()
        slot = await loop.run_in_executor(
            pool, lambda a=aid: gate.begin_tool_decision("bench", a, tool_name="shell")
        )
        cancel = asyncio.Event()
        task = loop.create_task(gate.await_tool_decision(slot, aid, cancel))
        await asyncio.sleep(0.002)
        t0 = time.perf_counter()
        if how == "event":
            cancel.set()
            assert await task == "deny"
        else:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        out.append(time.perf_counter() - t0)
    pool.shutdown()
    return out


def breakdown(n: int) -> dict[str, list[float]]:
    """Where a decision's time goes: the whole call, against the same work as ORM-built
    queries (a SELECT of the row, the conditional UPDATE and COMMIT) and as raw SQL."""
    from django.db import connection, transaction

    from approvals import gate
    from approvals.listener import get_listener
    from approvals.models import Approval

    aids = []
    for _ in range(3 * n):
        aid = gate.new_approval_id()
        get_listener().unregister(gate.begin_tool_decision("bench", aid, tool_name="shell"))
        aids.append(aid)
    out: dict[str, list[float]] = {"resolve": [], "select": [], "update": [], "sql": []}
    table = Approval._meta.db_table
    for aid in aids[:n]:
        t0 = time.perf_counter()
        gate.resolve_tool_decision(aid, "allow")
        out["resolve"].append(time.perf_counter() - t0)
    for aid in aids[n : 2 * n]:
        t0 = time.perf_counter()
        Approval.objects.filter(approval_id=aid).values("pk", "status", "expires_at").first()
        t1 = time.perf_counter()
        with transaction.atomic():
            Approval.objects.filter(approval_id=aid, status="pending").update(reason="")
        out["select"].append(t1 - t0)
        out["update"].append(time.perf_counter() - t1)
    with connection.cursor() as cursor:
        for aid in aids[2 * n :]:
            t0 = time.perf_counter()
            with transaction.atomic():
                cursor.execute(f"SELECT id FROM {table} WHERE approval_id = %s", [aid])
                cursor.fetchone()
                cursor.execute(
                    f"UPDATE {table} SET reason = '' WHERE approval_id = %s AND status = 'pending'",
                    [aid],
                )
            out["sql"].append(time.perf_counter() - t0)
    return out


def wake_with_own_checkpoints(n: int) -> list[float]:
    """The async wake trials again with ``SQLITE_CHECKPOINTS`` off (the baseline):
    the commit that fills the WAL copies it back itself, as SQLite does by default."""
    from django.conf import settings
    from django.test import override_settings

    from approvals import listener

    listener.shutdown()  # started again below without the checkpoint thread
    own = {**getattr(settings, "APPROVALS", {}), "SQLITE_CHECKPOINTS": False}
    with override_settings(APPROVALS=own):
        out = asyncio.run(_wake_async(n))
        listener.shutdown()
    return out


def checkpoint_figures(wa: list[float], wa_own: list[float]) -> dict:
    """The async wake with the checkpoint thread (the default) against without it."""
    return {
        "wake_async_own_ckpt_p50_ms": figure(
            _ms(wa_own, 50), "ms", "wake, async waiter, p50, SQLite's own checkpoints (baseline)"
        ),
        "wake_async_own_ckpt_p99_ms": figure(
            _ms(wa_own, 99), "ms", "wake, async waiter, p99, SQLite's own checkpoints (baseline)"
        ),
        "wake_async_ckpt_ratio_p99": figure(
            _ms(wa, 99) / max(_ms(wa_own, 99), 1e-6),
            "x",
            "wake, async waiter, p99, checkpoint thread / SQLite's own",
        ),
    }


# -- the run ----------------------------------------------------------------


def _ms(values: list[float], q: float) -> float:
    return percentile(values, q) * MS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer trials, shorter idle windows")
    parser.add_argument("--section", choices=["toolgate", "threads"], help=argparse.SUPPRESS)
    parser.add_argument("--database-url", help=argparse.SUPPRESS)
    parser.add_argument("--waiters", type=int, default=10_000)
    parser.add_argument("--cancels", type=int, default=200)
    parser.add_argument(
        "--also-python",
        action="append",
        default=[p for p in os.environ.get("TOOLGATE_BENCH_PYTHONS", "").split(",") if p],
        metavar="PATH",
        help="also measure the 10,000 waiters under this interpreter (its own venv with the "
        "requirements; TOOLGATE_BENCH_PYTHONS=a,b does the same)",
    )
    args = parser.parse_args()
    os.environ.pop("REDIS_URL", None)
    if args.section:
        setup_django(args.database_url, migrate=False)
        if args.section == "toolgate":
            section_toolgate(args.waiters)
        else:
            section_threads(args.waiters, args.cancels)
        return
    database_url = setup_django()
    try:
        run(args, database_url)
    finally:
        remove_sqlite(database_url)


def _forget_pending() -> None:
    """Delete the calls left pending by what ran before (this process's own trials, a
    killed child's 10,000 waiters). Their processes stop beating, so a child's sweep
    would mark them abandoned in the middle of its idle window and the figure would
    be that sweep's work, not the idle waiters'."""
    from approvals.models import Approval, Status

    Approval.objects.filter(status=Status.PENDING).delete()


def run(args: argparse.Namespace, database_url: str) -> None:
    n = 300 if args.quick else 2000
    ncancel = 100 if args.quick else 300
    # A full run's window spans one whole period of the listener's full check of
    # every waiting id (every 30 s): a shorter one would include it or not by luck.
    idle = 5.0 if args.quick else 30.0
    warm_up()
    with RecheckPasses() as passes:
        ws = wake_sync(n)
        wa = asyncio.run(_wake_async(n))
    wa_own = wake_with_own_checkpoints(n)
    cs = cancel_sync(ncancel)
    ce = asyncio.run(_cancel_async(ncancel, "event"))
    ct = asyncio.run(_cancel_async(ncancel, "task"))
    parts = breakdown(300 if args.quick else 1000)
    from approvals import listener

    listener.shutdown()  # this process now only waits for its children
    _forget_pending()
    tg = run_child("toolgate", database_url, idle, waiters=10_000)
    _forget_pending()
    th = run_child("threads", database_url, idle, waiters=5_000, cancels=200)
    f = latency_figures(ws, wa, cs, ce, ct, parts) | idle_figures(tg, th, cs + ce + ct)
    f |= checkpoint_figures(wa, wa_own)
    f |= passes.figures(2 * n)
    for python in args.also_python:
        other = run_child("toolgate", database_url, idle, python=python, waiters=10_000)
        _forget_pending()
        f |= other_python_figures(python, other)
    for fig in f.values():
        if fig["goal"]:
            limit = float(fig["goal"].split()[-1])
            fig["met"] = fig["value"] is not None and fig["value"] <= limit
    notes = [
        f"{n} wake trials and {ncancel} cancel trials per kind; SQLite file DB, WAL, "
        "no Redis; every decision writes its audit row before the waiter wakes",
        f"idle CPU measured over {idle:.0f} s with the database re-check running "
        "(RECHECK_INTERVAL 1 s; the full check of every waiting id runs every 30 s)",
        "idle CPU of the 10,000 waiters' process by thread, % of a core: "
        + ", ".join(f"{name} {pct:.3f}" for name, pct in tg["idle_by_thread"].items()),
    ]
    report("gate", f, notes)


class RecheckPasses:
    """Counts the listener's re-check passes meanwhile, and the CPU each takes.

    This process commits its own decisions, and the database watcher cannot
    tell them from another process's: it asks for a pass per commit, which
    competes with the waking waiter for the interpreter lock.
    """

    def __enter__(self):
        from approvals.listener import Listener

        self.count, self.cpu = 0, 0.0
        self._real = real = Listener.recheck

        def counted(listener):
            started = time.thread_time()
            try:
                return real(listener)
            finally:
                self.count += 1
                self.cpu += time.thread_time() - started

        Listener.recheck = counted
        return self

    def __exit__(self, *exc):
        from approvals.listener import Listener

        Listener.recheck = self._real

    def figures(self, trials: int) -> dict:
        per_pass = self.cpu / self.count * 1000 if self.count else None
        return {
            "recheck_passes": figure(
                self.count / trials, "", "re-check passes per wake trial (watcher kicks)"
            ),
            "recheck_cpu_ms": figure(per_pass, "ms", "CPU per re-check pass during the trials"),
        }


def other_python_figures(python: str, tg: dict) -> dict:
    """The 10,000 waiters under another interpreter (named by its version)."""
    import subprocess

    version = subprocess.run(
        [python, "-c", "import sys, django; print(sys.version.split()[0], django.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    tag = f"Python {version[0]}, Django {version[1]}"
    key = "py" + "".join(version[0].split(".")[:2])
    return {
        f"{key}_waiters_rss": figure(
            tg["rss_delta_mib"], "MiB", f"10,000 async waiters ({tag}): RSS above baseline", "≤ 50"
        ),
        f"{key}_waiters_cpu": figure(
            tg["idle_cpu_percent"],
            "% of a core",
            f"10,000 async waiters ({tag}): CPU while idle",
            "≤ 1",
        ),
    }


def latency_figures(ws, wa, cs, ce, ct, parts) -> dict:
    """Wake and cancel latency, and the breakdown of one decision."""
    return {
        "wake_sync_p50_ms": figure(_ms(ws, 50), "ms", "wake, sync waiter, p50", "≤ 1", None),
        "wake_sync_p99_ms": figure(_ms(ws, 99), "ms", "wake, sync waiter, p99", "≤ 5", None),
        "wake_async_p50_ms": figure(_ms(wa, 50), "ms", "wake, async waiter, p50", "≤ 1", None),
        "wake_async_p99_ms": figure(_ms(wa, 99), "ms", "wake, async waiter, p99", "≤ 5", None),
        "cancel_thread_event_p50_ms": figure(_ms(cs, 50), "ms", "cancel, threading.Event, p50"),
        "cancel_thread_event_p99_ms": figure(
            _ms(cs, 99), "ms", "cancel, threading.Event, p99", "≤ 20"
        ),
        "cancel_asyncio_event_p50_ms": figure(_ms(ce, 50), "ms", "cancel, asyncio.Event, p50"),
        "cancel_asyncio_event_p99_ms": figure(
            _ms(ce, 99), "ms", "cancel, asyncio.Event, p99", "≤ 20"
        ),
        "cancel_task_p50_ms": figure(_ms(ct, 50), "ms", "cancel, task.cancel(), p50"),
        "cancel_task_p99_ms": figure(_ms(ct, 99), "ms", "cancel, task.cancel(), p99", "≤ 20"),
        "resolve_alone_p50_ms": figure(
            _ms(parts["resolve"], 50), "ms", "breakdown: resolve_tool_decision alone, p50"
        ),
        "orm_select_p50_ms": figure(
            _ms(parts["select"], 50), "ms", "breakdown: an ORM-built SELECT of the row, p50"
        ),
        "orm_update_p50_ms": figure(
            _ms(parts["update"], 50), "ms", "breakdown: an ORM-built UPDATE + COMMIT, p50"
        ),
        "sql_floor_p50_ms": figure(
            _ms(parts["sql"], 50), "ms", "breakdown: SELECT + UPDATE + COMMIT in raw SQL, p50"
        ),
    }


def idle_figures(tg: dict, th: dict, cancel_all: list[float]) -> dict:
    """10,000 idle toolgate waiters against 5,000 of the polling gate."""
    tg_per = tg["rss_delta_mib"] / 10_000
    th_per = th["rss_delta_mib"] / 5_000
    return {
        "idle10k_rss_mib": figure(
            tg["rss_delta_mib"], "MiB", "10,000 async waiters: RSS above baseline", "≤ 50"
        ),
        "idle10k_cpu_percent": figure(
            tg["idle_cpu_percent"], "% of a core", "10,000 async waiters: CPU while idle", "≤ 1"
        ),
        "idle10k_extra_threads": figure(
            tg["extra_threads"], "threads", "10,000 async waiters: threads added"
        ),
        "begin_ms": figure(tg["begin_per_call_ms"], "ms", "begin_tool_decision, mean per call"),
        "poll5k_rss_mib": figure(
            th["rss_delta_mib"], "MiB", "polling gate, 5,000 thread waiters: RSS above baseline"
        ),
        "poll5k_cpu_percent": figure(
            th["idle_cpu_percent"], "% of a core", "polling gate, 5,000 waiters: CPU while idle"
        ),
        "poll_cancel_p50_ms": figure(th["cancel_p50_ms"], "ms", "polling gate: cancel p50"),
        "ratio_memory_per_waiter": figure(
            th_per / tg_per if tg_per > 0 else None,
            "x",
            "memory per waiter, polling gate / toolgate",
        ),
        "ratio_idle_cpu": figure(
            th["idle_cpu_percent"] / max(tg["idle_cpu_percent"], 0.01),
            "x",
            "idle CPU, polling gate (5,000) / toolgate (10,000)",
        ),
        "ratio_cancel_p50": figure(
            th["cancel_p50_ms"] / max(_ms(cancel_all, 50), 1e-6),
            "x",
            "cancel p50, polling gate / toolgate (all three cancel kinds)",
        ),
    }


if __name__ == "__main__":
    main()
