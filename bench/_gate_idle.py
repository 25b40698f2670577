"""The gate benchmark's memory and idle-CPU sections, each run in a child process.

``bench/gate.py --section toolgate|threads`` runs one of them; the parent
(:func:`run_child`) measures the child's RSS and CPU from outside through
/proc, so a child whose threads hog the GIL cannot skew its own figures.
``PollingGate`` is the original in-process design (one thread per waiter,
polling every 0.5 s), reimplemented here only for comparison.
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _common import child_env, cpu_by_name, cpu_of, percentile, rss_mib, rss_of, thread_cpu

MS = 1000.0
GATE = str(Path(__file__).resolve().with_name("gate.py"))


def warm_up() -> None:
    from approvals import gate

    for _ in range(3):
        aid = gate.new_approval_id()
        slot = gate.begin_tool_decision("warm", aid, tool_name="shell")
        gate.resolve_tool_decision(aid, "allow")
        gate.wait_tool_decision(slot, aid)


def section_toolgate(waiters: int) -> None:
    """``waiters`` tasks each awaiting ``arequest_tool_decision`` (begin + wait, the way an
    agent runs) in one event loop, then idle until killed."""
    from approvals import gate
    from approvals.listener import get_listener

    warm_up()
    time.sleep(1.5)
    base = rss_mib()
    threads_before = threading.active_count()

    async def main() -> None:
        listener = get_listener()
        t0 = time.perf_counter()
        tasks = [
            asyncio.create_task(
                gate.arequest_tool_decision(
                    f"s{i % 50}", gate.new_approval_id(), tool_name="shell", arguments={"i": i}
                )
            )
            for i in range(waiters)
        ]
        while listener.pending_slots() < waiters:  # noqa: ASYNC110 (a count kept by threads)
            await asyncio.sleep(0.02)
        begin_ms = (time.perf_counter() - t0) / waiters * MS
        await asyncio.sleep(0.5)
        assert not any(t.done() for t in tasks)
        _ready(
            base_rss_mib=base,
            pending_slots=listener.pending_slots(),
            extra_threads=threading.active_count() - threads_before,
            begin_per_call_ms=begin_ms,
        )
        await asyncio.sleep(3600)

    asyncio.run(main())


def _ready(**info) -> None:
    """Tell the parent the waiters are in place, and which thread is which (kernel
    thread id to name); it measures this process from outside."""
    info["threads"] = {str(t.native_id): t.name for t in threading.enumerate()}
    print("SECTION " + json.dumps(info), flush=True)


class PollingGate:
    """The original design: a dict of pending calls, one thread per waiter, 0.5 s polls."""

    def __init__(self) -> None:
        self.pending: dict[str, dict] = {}
        self.lock = threading.Lock()

    def begin(self, aid: str) -> None:
        with self.lock:
            self.pending[aid] = {"event": threading.Event(), "decision": None}

    def wait(self, aid: str, cancel: threading.Event, timeout: float = 3600) -> str:
        entry = self.pending[aid]
        deadline = time.monotonic() + timeout
        try:
            while True:
                if entry["event"].wait(0.5):
                    return entry["decision"]
                if cancel.is_set() or time.monotonic() > deadline:
                    return "deny"
        finally:
            with self.lock:
                self.pending.pop(aid, None)

    def resolve(self, aid: str, decision: str) -> bool:
        entry = self.pending.get(aid)
        if entry is None:
            return False
        entry["decision"] = decision
        entry["event"].set()
        return True


def section_threads(waiters: int, cancels: int) -> None:
    """The polling gate: cancel latency, then ``waiters`` polling threads until killed."""
    warm_up()
    time.sleep(1.5)
    g = PollingGate()
    cancel_p50 = _polling_cancel_p50(g, cancels)
    time.sleep(1.0)
    base = rss_mib()
    go, stop = threading.Event(), threading.Event()

    def waiter(aid: str) -> None:
        go.wait()  # start polling only once all exist, or starting them crawls
        g.wait(aid, stop)

    for i in range(waiters):
        g.begin(f"t{i}")
        threading.Thread(target=waiter, args=(f"t{i}",), daemon=True).start()
    go.set()
    _ready(base_rss_mib=base, cancel_p50_ms=cancel_p50)
    time.sleep(3600)


def _polling_cancel_p50(g: PollingGate, cancels: int) -> float:
    lat: list[float] = []
    lock = threading.Lock()

    def one(i: int, ev: threading.Event, set_at: list) -> None:
        g.wait(f"c{i}", ev)
        with lock:
            lat.append(time.perf_counter() - set_at[0])

    boxes = []
    for i in range(cancels):
        g.begin(f"c{i}")
        ev, set_at = threading.Event(), [0.0]
        threading.Thread(target=one, args=(i, ev, set_at), daemon=True).start()
        boxes.append((ev, set_at))
    for ev, set_at in boxes:  # cancels land at random points of the 0.5 s poll
        time.sleep(random.uniform(0, 0.01))
        set_at[0] = time.perf_counter()
        ev.set()
    while len(lat) < cancels:
        time.sleep(0.05)
    return percentile(lat, 50) * MS


def run_child(
    section: str, database_url: str, idle: float, python: str = sys.executable, **kw
) -> dict:
    """Start a section in a child, then measure its RSS and idle CPU from here.

    Measuring from outside keeps the figures honest when the child's own
    threads would starve a measuring thread of the GIL (the polling gate does).
    """
    args = [python, GATE, "--section", section, "--database-url", database_url]
    for k, v in kw.items():
        args += [f"--{k.replace('_', '-')}", str(v)]
    errors = tempfile.TemporaryFile("w+")  # noqa: SIM115 (closed in finally)
    proc = subprocess.Popen(
        args, env=child_env(database_url), stdout=subprocess.PIPE, stderr=errors, text=True
    )
    try:
        for line in proc.stdout:
            if line.startswith("SECTION "):
                info = json.loads(line[len("SECTION ") :])
                break
        else:
            errors.seek(0)
            raise RuntimeError(f"section {section} failed:\n{errors.read()[-3000:]}")
        time.sleep(2.0)  # settle: every waiter has started waiting
        info["rss_delta_mib"] = rss_of(proc.pid) - info["base_rss_mib"]
        c0, t0, threads0 = cpu_of(proc.pid), time.monotonic(), thread_cpu(proc.pid)
        time.sleep(idle)
        seconds = time.monotonic() - t0
        info["idle_cpu_percent"] = 100 * (cpu_of(proc.pid) - c0) / seconds
        after = thread_cpu(proc.pid)
        info["idle_by_thread"] = cpu_by_name(info["threads"], threads0, after, 100 / seconds)
        return info
    finally:
        proc.kill()
        proc.wait()
        errors.close()
