"""Webhook delivery: gate -> webhook received, deliveries per second, the gate's added cost.

Run: ``python bench/webhooks.py`` (``--quick`` for fewer calls). One process on
a temp SQLite database, no Redis: the gate, the process listener with its
outbox worker, and a receiver (tests/receiver.py) on 127.0.0.1 all share this
process (and its GIL), so the figures are a floor for what a separate receiver
sees.

* gate -> the receiver has the ``approval.requested`` POST, p50/p99: the outbox
  row committed with the call, the worker woken after commit, one POST;
* deliveries per second one worker sustains (``WEBHOOK_CONCURRENCY`` 8, a
  backlog of rows due at once);
* what one active webhook adds to gating a call (p50, vs no webhook).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))
from _common import figure, percentile, remove_sqlite, report, setup_django  # noqa: E402

NAME = "webhooks"
MS = 1000.0


def _gate_times(gate, n: int) -> list[float]:
    times = []
    for _ in range(n):
        aid = gate.new_approval_id()
        t0 = time.monotonic()
        gate.begin_tool_decision("bench", aid, tool_name="run_shell", arguments={"cmd": "ls"})
        times.append(time.monotonic() - t0)
    return times


def _latency(gate, receiver, n: int) -> list[float]:
    sent: dict[str, float] = {}
    for _ in range(n):
        aid = gate.new_approval_id()
        sent[aid] = time.monotonic()
        gate.begin_tool_decision("bench", aid, tool_name="run_shell", arguments={"cmd": "ls"})
        time.sleep(0.01)
    receiver.wait_for(n, timeout=60)
    got = {r.json()["approval"]["approval_id"]: r.at for r in receiver.accepted}
    return [got[aid] - t0 for aid, t0 in sent.items()]


def _throughput(receiver, hook, rows: int) -> float:
    from approvals import notify_worker
    from approvals.models import Delivery

    before = len(receiver.accepted)
    Delivery.objects.bulk_create(
        Delivery(webhook=hook, event="ping", body='{"event":"ping"}') for _ in range(rows)
    )
    t0 = time.monotonic()
    notify_worker.wake()
    receiver.wait_for(before + rows, timeout=120)
    return rows / (time.monotonic() - t0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    n, rows = (100, 500) if args.quick else (300, 2000)
    url = setup_django()
    try:
        from approvals import gate
        from approvals.models import Webhook
        from tests.receiver import Receiver

        receiver = Receiver()
        bare = _gate_times(gate, 50) and _gate_times(gate, n)  # warm, then measure
        hook = Webhook.objects.create(
            url=receiver.url, secret="bench", events=["approval.requested"]
        )
        with_hook = _gate_times(gate, n)
        receiver.wait_for(n, timeout=60)
        receiver.requests.clear()
        latency = _latency(gate, receiver, n)
        rate = _throughput(receiver, hook, rows)
        receiver.close()
    finally:
        remove_sqlite(url)
    added = (percentile(with_hook, 50) - percentile(bare, 50)) * MS
    report(
        NAME,
        {
            "gate_to_webhook_p50": figure(
                percentile(latency, 50) * MS, "ms", "gate → webhook received, p50"
            ),
            "gate_to_webhook_p99": figure(
                percentile(latency, 99) * MS, "ms", "gate → webhook received, p99"
            ),
            "deliveries_per_second": figure(
                rate, "/s", "deliveries per second, one worker (8 senders)"
            ),
            "gate_p50_no_webhook": figure(
                percentile(bare, 50) * MS, "ms", "gate a call, no webhook, p50"
            ),
            "gate_p50_one_webhook": figure(
                percentile(with_hook, 50) * MS, "ms", "gate a call, one webhook, p50"
            ),
            "gate_added_by_webhook": figure(added, "ms", "added to gating by one webhook, p50"),
        },
        notes=["receiver, worker and gate share one process (GIL): a floor, not a ceiling"],
    )


if __name__ == "__main__":
    main()
