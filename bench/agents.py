"""1,000 HTTP agents long-polling one daphne process, each with a pending call.

Run: ``python bench/agents.py`` (``--agents N``, ``--quick``). One daphne
process serves the site on a temporary SQLite database. This process opens one
keep-alive connection per agent (raw asyncio streams, one event loop), gates a
call per agent (``POST approvals``), then holds ``GET approvals/<id>?wait=60``
open on each. Measured: daphne's RSS and thread count before and while all
wait (per waiting agent), daphne's CPU while they wait, then every call is
decided from this process (``gate.resolve_tool_decision``) and each wake timed
(decision committed -> its answer read). A decision made in another process
reaches daphne through its database re-check (``RECHECK_INTERVAL``, 1 s)
without Redis, so the wake figures show that interval.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
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


def threads_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return 0


class Agent:
    def __init__(self, port: int, key: str) -> None:
        self.port, self.key = port, key
        self.reader = self.writer = None

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)

    async def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        data = b"" if body is None else json.dumps(body).encode()
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {self.key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
        )
        self.writer.write(head.encode() + data)
        status = int((await self.reader.readline()).split()[1])
        length = 0
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        return status, json.loads(await self.reader.readexactly(length))


async def run_agents(port: int, key: str, count: int, waiting: asyncio.Event, woke: dict):
    agents = [Agent(port, key) for _ in range(count)]
    for i in range(0, count, 100):
        await asyncio.gather(*(a.open() for a in agents[i : i + 100]))
    ids = []
    for i in range(0, count, 50):
        answers = await asyncio.gather(
            *(
                a.request(
                    "POST", "/api/inference/approvals", {"session_id": "bench", "tool_name": "t"}
                )
                for a in agents[i : i + 50]
            )
        )
        ids += [body["approval_id"] for status, body in answers]

    async def poll(agent: Agent, aid: str) -> None:
        while True:
            status, body = await agent.request("GET", f"/api/inference/approvals/{aid}?wait=60")
            if body["status"] != "pending":
                woke[aid] = time.monotonic()
                return

    tasks = [asyncio.create_task(poll(a, aid)) for a, aid in zip(agents, ids, strict=True)]
    waiting.set()
    await asyncio.gather(*tasks)
    return ids


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    count = 200 if args.quick else args.agents
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 4 * count + 256)), hard))
    url = setup_django()
    sys.path.insert(0, str(ROOT))
    from django.contrib.auth.models import User

    from approvals import agentkeys, gate
    from tests.procs import start_daphne, wait_ready

    user = User.objects.create_user("bench-agent")
    key = agentkeys.create_key(user, "bench")[1]
    server = wait_ready(start_daphne(child_env(url)))
    try:
        figures = asyncio.run(measure(server, key, count, gate))
    finally:
        server.stop()
        remove_sqlite(url)
    report("agents", figures, [f"{count} agents, one daphne process, SQLite, no Redis"])


def all_waiting(count: int, timeout: float = 120) -> None:
    """Block until daphne has taken up every agent's long-poll.

    A wait dates the call's ``agent_seen_at`` to the wait's end (60 s ahead), so
    the CPU window below starts only once the first GETs are all handled.
    """
    from datetime import timedelta

    from django.utils import timezone

    from approvals.models import Approval

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ahead = timezone.now() + timedelta(seconds=30)
        rows = Approval.objects.filter(session_id="bench", agent_seen_at__gt=ahead)
        if rows.count() >= count:
            return
        time.sleep(0.2)
    raise TimeoutError("not every agent is waiting")


async def measure(server, key, count, gate) -> dict:
    pid = server.proc.pid
    # Warm up: one call gated, waited for briefly and cancelled.
    warm = Agent(server.port, key)
    await warm.open()
    _, body = await warm.request(
        "POST", "/api/inference/approvals", {"session_id": "w", "tool_name": "t"}
    )
    await warm.request("GET", f"/api/inference/approvals/{body['approval_id']}?wait=0.1")
    rss0, threads0 = rss_of(pid), threads_of(pid)
    waiting, woke = asyncio.Event(), {}
    runner = asyncio.create_task(run_agents(server.port, key, count, waiting, woke))
    await waiting.wait()
    await asyncio.to_thread(all_waiting, count)
    await asyncio.sleep(1)
    rss1, threads1 = rss_of(pid), threads_of(pid)
    c0, t0 = cpu_of(pid), time.monotonic()
    await asyncio.sleep(5)
    idle_cpu = 100 * (cpu_of(pid) - c0) / (time.monotonic() - t0)
    from django.db.models import F  # noqa: F401

    from approvals.models import Approval

    ids = await asyncio.to_thread(
        lambda: list(
            Approval.objects.filter(session_id="bench").values_list("approval_id", flat=True)
        )
    )
    decided = {}

    def decide_all() -> None:
        for aid in ids:
            gate.resolve_tool_decision(aid, "allow")
            decided[aid] = time.monotonic()

    await asyncio.to_thread(decide_all)
    await asyncio.wait_for(runner, 60)
    wakes = [1000 * (woke[a] - decided[a]) for a in ids if a in woke]
    per_agent = (rss1 - rss0) * 1024 / count
    return {
        "rss_per_agent": figure(
            per_agent, "KiB", "daphne RSS per waiting agent", "< 64 KiB", per_agent < 64
        ),
        "rss_growth": figure(rss1 - rss0, "MiB", f"daphne RSS growth with {count} waiting"),
        "threads": figure(
            threads1 - threads0,
            "",
            "daphne threads added while they wait",
            "0 (< 10)",
            threads1 - threads0 < 10,
        ),
        "idle_cpu": figure(idle_cpu, "% core", "daphne CPU while all wait", "< 5", idle_cpu < 5),
        "wake_p50": figure(percentile(wakes, 50), "ms", "wake p50 (decided in another process)"),
        "wake_p99": figure(
            percentile(wakes, 99),
            "ms",
            "wake p99 (decided in another process)",
            "< 1500 (re-check 1 s)",
            percentile(wakes, 99) < 1500,
        ),
        "woken": figure(len(wakes), "", "agents woken", str(count), len(wakes) == count),
    }


if __name__ == "__main__":
    main()
