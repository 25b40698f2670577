"""The HTTP load of bench/http_load.py, in a process of its own.

Reads one job as JSON on stdin, prints one result as JSON on stdout; the
standard library only. Its threads share no interpreter lock with the agent
(the benchmark process, where thousands of waiters wake as decisions land),
so a busy agent does not slow the clients down in the decision rounds only,
and what is measured is the server.

Job: ``{"port", "origin", "sessionid", "clients", "kind": "trivial"|"decide",
"count"}`` (trivial) or ``"ids"`` (decide); ``"path"`` and ``"method"`` send
another request ``count`` times instead of the trivial GET (a POST carries a
small JSON body). Each client holds one keep-alive
connection, opened before the clock starts. Result: ``{"seconds", "sent":
{approval_id: monotonic time sent}, "rtts": [...], "failures": [...]}``.
``time.monotonic`` is the system's monotonic clock, so the benchmark process
compares ``sent`` with its own wake times.
"""

from __future__ import annotations

import http.client
import json
import queue
import secrets
import sys
import threading
import time

TRIVIAL_PATH = "/bench/ping"
DECIDE_PATH = "/api/inference/tool-confirm"


def run(job: dict) -> dict:
    work: queue.Queue = queue.Queue()
    items = job["ids"] if job["kind"] == "decide" else range(job["count"])
    for item in items:
        work.put(item)
    clients = min(job["clients"], max(1, work.qsize()))
    ready = threading.Barrier(clients + 1, timeout=60)
    sent: dict[str, float] = {}
    rtts: list[float] = []
    failures: list = []
    lock = threading.Lock()

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", job["port"], timeout=30)
        csrf = secrets.token_hex(16)  # Django accepts a token the client makes up
        cookie = f"sessionid={job['sessionid']}; csrftoken={csrf}"
        headers = {
            "Content-Type": "application/json",
            "Cookie": cookie,
            "X-CSRFToken": csrf,
            "Origin": job["origin"],
        }
        conn.connect()
        ready.wait()
        try:
            while True:
                try:
                    item = work.get_nowait()
                except queue.Empty:
                    return
                t0 = time.monotonic()
                if job["kind"] == "decide":
                    body = json.dumps({"approval_id": item, "decision": "allow"})
                    conn.request("POST", DECIDE_PATH, body=body, headers=headers)
                elif job.get("method", "GET") == "POST":
                    body = json.dumps({"approval_id": "x" * 22, "decision": "allow"})
                    conn.request("POST", job["path"], body=body, headers=headers)
                else:
                    path = job.get("path", TRIVIAL_PATH)
                    conn.request("GET", path, headers={"Cookie": cookie})
                response = conn.getresponse()
                payload = response.read()
                t1 = time.monotonic()
                with lock:
                    rtts.append(t1 - t0)
                    if job["kind"] == "decide":
                        sent[item] = t0
                    if response.status != 200:
                        failures.append((response.status, payload[:200].decode(errors="replace")))
        finally:
            conn.close()

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    ready.wait()
    start = time.monotonic()
    for thread in threads:
        thread.join()
    return {
        "seconds": time.monotonic() - start,
        "sent": sent,
        "rtts": rtts,
        "failures": failures[:5],
        "failed": len(failures),
    }


if __name__ == "__main__":
    print(json.dumps(run(json.load(sys.stdin))))
