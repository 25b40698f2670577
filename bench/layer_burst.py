"""A burst of events through the channel-layer link over Redis: batched against one by one.

Run: ``python bench/layer_burst.py`` (``--events N``, ``--rounds N``). Needs
Redis (``TOOLGATE_TEST_REDIS_URL`` or ``REDIS_URL``); without it, it says so
and skips. Two links (``approvals.channellink.LayerLink``) on the same group,
each on its own thread and event loop as in two processes, over
``channels_redis``'s pub/sub layer as the listener uses it. One link is
handed ``--events`` events at once (what "Allow all", a sweep or a rule
change across many calls hands it); the figures are the time until the other
link has the last one, and the publishes it took. The baseline is the same
link with ``BATCH_MAX = 1`` (one publish per event, as before batching), in
alternating rounds in the same process; medians over the rounds. Then the
latency of a lone event (one at a time, the link idle), batched links only:
a lone event is never held back to wait for company.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, figure, percentile, report, skip  # noqa: E402

sys.path.insert(0, str(ROOT))
MS = 1000.0


class Heard:
    def __init__(self) -> None:
        self.count = 0
        self.last_at = 0.0
        self.arrived = threading.Event()
        self.expect = 0

    def __call__(self, message: dict) -> None:
        self.count += 1
        self.last_at = time.perf_counter()
        if self.count >= self.expect:
            self.arrived.set()

    def reset(self, expect: int) -> None:
        self.count, self.expect = 0, expect
        self.arrived.clear()


def burst(sender, heard: Heard, events: int, batch_max: int) -> tuple[float, int]:
    """Seconds until the last of ``events`` arrived, and the publishes they took."""
    from approvals import channellink

    channellink.BATCH_MAX = batch_max
    publishes = [0]
    real = sender.layer.group_send  # the pub/sub layer's proxy to its per-loop layer

    async def counting(group, message):
        publishes[0] += 1
        await real(group, message)

    sender.layer.group_send = counting
    heard.reset(events)
    started = time.perf_counter()
    for n in range(events):
        sender.send({"type": "approvals.event", "origin": "bench", "event": {"n": n}})
    if not heard.arrived.wait(60):
        raise RuntimeError(f"only {heard.count} of {events} events arrived")
    del sender.layer.group_send
    return heard.last_at - started, publishes[0]


def lone_latencies(sender, heard: Heard, count: int) -> list[float]:
    out = []
    for n in range(count):
        heard.reset(1)
        started = time.perf_counter()
        sender.send({"type": "approvals.event", "origin": "bench", "event": {"n": n}})
        if not heard.arrived.wait(5):
            raise RuntimeError("a lone event did not arrive")
        out.append(heard.last_at - started)
        time.sleep(0.002)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    opts = parser.parse_args()
    url = os.environ.get("TOOLGATE_TEST_REDIS_URL") or os.environ.get("REDIS_URL")
    if not url:
        skip("layer burst", "needs Redis: set TOOLGATE_TEST_REDIS_URL or REDIS_URL")
        return
    from channels_redis.pubsub import RedisPubSubChannelLayer

    from approvals import channellink

    default_max = channellink.BATCH_MAX
    group = f"approvals.bench-burst-{os.getpid()}"
    heard = Heard()
    sender = channellink.LayerLink(RedisPubSubChannelLayer(hosts=[url]), group, lambda m: None)
    other = channellink.LayerLink(RedisPubSubChannelLayer(hosts=[url]), group, heard)
    sender.start()
    other.start()
    rounds = 2 if opts.quick else opts.rounds
    results: dict[str, list[tuple[float, int]]] = {"batched": [], "one by one": []}
    try:
        time.sleep(0.3)  # both subscriptions active
        burst(sender, heard, 200, default_max)  # warm up
        for _ in range(rounds):
            results["batched"].append(burst(sender, heard, opts.events, default_max))
            results["one by one"].append(burst(sender, heard, opts.events, 1))
        channellink.BATCH_MAX = default_max
        lone = lone_latencies(sender, heard, 200)
    finally:
        channellink.BATCH_MAX = default_max
        sender.stop()
        other.stop()
    seconds = {k: statistics.median(s for s, _ in v) for k, v in results.items()}
    publishes = {k: statistics.median(p for _, p in v) for k, v in results.items()}
    n = opts.events
    figures = {
        "burst_batched_ms": figure(
            seconds["batched"] * MS, "ms", f"{n} events handed over at once: last one arrives"
        ),
        "burst_one_by_one_ms": figure(
            seconds["one by one"] * MS, "ms", "the same, one publish per event (baseline)"
        ),
        "burst_speedup": figure(
            seconds["one by one"] / seconds["batched"], "x", "batched against one by one"
        ),
        "burst_publishes": figure(publishes["batched"], "", f"publishes for {n} events, batched"),
        "lone_p50_ms": figure(percentile(lone, 50) * MS, "ms", "a lone event, p50"),
        "lone_p99_ms": figure(percentile(lone, 99) * MS, "ms", "a lone event, p99"),
    }
    report(
        "layer burst",
        figures,
        [
            f"two links over Redis pub/sub in one process, {rounds} alternating rounds "
            "(medians); 200 lone events one at a time",
        ],
    )


if __name__ == "__main__":
    main()
