"""Sockets that never read: daphne's memory while calls pour in, and after they close.

Run: ``python bench/slow_sockets.py`` (``--sockets N``, ``--calls N``, ``--kib N``,
``--quick``). One daphne process (``DJANGO_DEBUG=0``) on a temporary SQLite
database; one user opens ``--sockets`` WebSockets (raw sockets with a 4 KiB
receive buffer) that read their snapshot and then never read again. This
process then gates ``--calls`` calls of ``--kib`` KiB of arguments for that
user (daphne learns of each from its database re-check). Measured: daphne's
RSS before the sockets open, its peak while the calls arrive (sampled every
50 ms), and 10 s after the sockets close; how the sockets ended. Issue 13
reported 102 MB -> 1.4 GB for 20 sockets and 3,000 calls of 20 KB, not given back.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, child_env, figure, remove_sqlite, report, rss_of, setup_django  # noqa: E402


class Sampler(threading.Thread):
    """Daphne's RSS every 50 ms; ``peak`` is the largest seen."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak, self.running = pid, 0.0, True

    def run(self) -> None:
        while self.running:
            try:
                self.peak = max(self.peak, rss_of(self.pid))
            except OSError:
                return
            time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sockets", type=int, default=20)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--kib", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="500 calls")
    args = parser.parse_args()
    if args.quick:
        args.calls = 500
    url = setup_django()
    sys.path.insert(0, str(ROOT))
    from django.contrib.auth import get_user_model
    from django.test import Client

    from approvals import gate
    from approvals.listener import get_listener
    from tests.procs import start_daphne, wait_ready
    from tests.rawws import DROPPED, close_code, open_socket, read_frame

    user = get_user_model().objects.create_user("bench-slow")
    client = Client()
    client.force_login(user)
    sessionid = client.cookies["sessionid"].value
    server = wait_ready(start_daphne(child_env(url)))
    sampler = Sampler(server.proc.pid)
    try:
        time.sleep(2)
        before = rss_of(server.proc.pid)
        sockets = []
        for _ in range(args.sockets):
            sock = open_socket(server.port, server.origin, sessionid)
            read_frame(sock)  # the snapshot; nothing is read after it
            sockets.append(sock)
        sampler.start()
        listener = get_listener()
        blob = "x" * (args.kib * 1024)
        started = time.monotonic()
        for _ in range(args.calls):
            slot = gate.begin_tool_decision(
                "s", gate.new_approval_id(), user=user, arguments={"blob": blob}
            )
            listener.unregister(slot)
        gating = time.monotonic() - started
        time.sleep(3)  # the last re-check delivers the last calls
        codes = [close_code(sock, timeout=5) for sock in sockets]
        during = sampler.peak
        for sock in sockets:
            sock.close()
        time.sleep(10)
        after = rss_of(server.proc.pid)
    finally:
        sampler.running = False
        server.stop()
        remove_sqlite(url)
    ended = {
        "4408": codes.count(4408),
        "dropped": codes.count(DROPPED),
        "open": codes.count(None),
    }
    growth = during - before
    report(
        "slow_sockets",
        {
            "rss_before": figure(before, "MiB", "daphne RSS before the sockets open"),
            "rss_peak": figure(
                during,
                "MiB",
                f"daphne RSS peak: {args.sockets} never-reading sockets, "
                f"{args.calls} calls of {args.kib} KiB",
                "< 300 MiB (issue: 1.4 GB)",
                during < 300,
            ),
            "rss_growth": figure(growth, "MiB", "peak growth over before"),
            "rss_after": figure(
                after,
                "MiB",
                "daphne RSS 10 s after the sockets close",
                "within 50 MiB of before",
                after - before < 50,
            ),
            "closed_4408": figure(
                ended["4408"] + ended["dropped"], "sockets", "sockets the server closed (4408)"
            ),
            "gating_seconds": figure(gating, "s", "time to gate the calls"),
        },
        [f"socket endings: {ended}"],
    )


if __name__ == "__main__":
    main()
