"""A WebSocket client in a process of its own that notes when each frame arrives.

The latency benchmarks time "gate -> ``tool_start`` on a socket". The socket's
client used to live in the benchmark's own process, which also reads the
agent's replies and drives the next step; the frame was then timed only once
that process got around to reading it, after the agent's ``gated`` line (on a
loaded machine, several milliseconds after it had arrived). A browser is a
process of its own, and so is this client: it reads its socket and nothing
else, and stamps each frame with ``time.monotonic()`` (one clock for every
process on a Linux host) the moment it is received.

Run by :class:`Receiver`; ``python bench/_receiver.py WS_URL ORIGIN SESSIONID``
prints ``ready`` once the snapshot came, then one JSON line per frame:
``{"type", "approval_id", "t"}``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path


class Receiver:
    """A socket of ``server`` signed in with ``sessionid``, read in a child process."""

    def __init__(self, server, sessionid: str, timeout: float = 30.0) -> None:
        from tests.procs import _die_with_parent

        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__)), server.ws_url, server.origin, sessionid],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
            preexec_fn=_die_with_parent,
        )
        self.arrived: dict[tuple[str, str], float] = {}
        self.cond = threading.Condition()
        self.ready = False
        self.gone = False
        threading.Thread(target=self._read, daemon=True).start()
        with self.cond:
            if not self.cond.wait_for(lambda: self.ready or self.gone, timeout) or self.gone:
                self.close()
                raise RuntimeError("the receiving socket did not open")

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self.cond:
                if line.strip() == "ready":
                    self.ready = True
                else:
                    frame = json.loads(line)
                    self.arrived[(frame["type"], frame["approval_id"])] = frame["t"]
                self.cond.notify_all()
        with self.cond:
            self.gone = True
            self.cond.notify_all()

    def arrival(self, kind: str, aid: str, timeout: float = 5.0) -> float:
        """When the ``kind`` frame for ``aid`` arrived (waiting up to ``timeout`` for it)."""
        key = (kind, aid)
        with self.cond:
            if not self.cond.wait_for(lambda: key in self.arrived or self.gone, timeout):
                raise TimeoutError(f"no {kind} for {aid} within {timeout}s")
            if key not in self.arrived:
                raise RuntimeError("the receiving socket closed")
            return self.arrived.pop(key)

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


def main(ws_url: str, origin: str, sessionid: str) -> None:
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    headers = {"Origin": origin, "Cookie": f"sessionid={sessionid}"}
    with connect(ws_url, additional_headers=headers, proxy=None, open_timeout=30) as sock:
        assert json.loads(sock.recv(timeout=30))["type"] == "snapshot"
        print("ready", flush=True)
        while True:
            try:
                raw = sock.recv()
            except ConnectionClosed:  # the server stopped
                return
            t = time.monotonic()
            frame = json.loads(raw)
            if "approval_id" in frame:
                line = {"type": frame["type"], "approval_id": frame["approval_id"], "t": t}
                print(json.dumps(line), flush=True)


if __name__ == "__main__":
    try:
        main(*sys.argv[1:4])
    except (KeyboardInterrupt, BrokenPipeError):
        pass
