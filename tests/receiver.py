"""A webhook receiver for tests: a threaded HTTP server on 127.0.0.1 recording every POST.

``Receiver()`` binds a free port (or ``port=``); ``fail_next(n, code)`` answers
the next ``n`` requests with ``code``; ``hang = seconds`` holds every answer
that long; ``wait_for(n)`` blocks until ``n`` requests were accepted (2xx).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Request:
    path: str
    headers: dict[str, str]
    body: bytes
    status: int
    at: float  # time.monotonic() when it arrived

    def json(self) -> dict:
        return json.loads(self.body)


class Receiver:
    def __init__(self, port: int = 0) -> None:
        self.requests: list[Request] = []
        self.cond = threading.Condition()
        self.failures: list[int] = []
        self.hang = 0.0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                arrived = time.monotonic()
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if receiver.hang:
                    time.sleep(receiver.hang)
                with receiver.cond:
                    status = receiver.failures.pop(0) if receiver.failures else 200
                    headers = {k.lower(): v for k, v in self.headers.items()}
                    receiver.requests.append(Request(self.path, headers, body, status, arrived))
                    receiver.cond.notify_all()
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"ok")
                except OSError:
                    pass

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def fail_next(self, n: int, code: int = 503) -> None:
        with self.cond:
            self.failures.extend([code] * n)

    @property
    def accepted(self) -> list[Request]:
        with self.cond:
            return [r for r in self.requests if 200 <= r.status < 300]

    def wait_for(self, n: int, timeout: float = 15.0) -> list[Request]:
        deadline = time.monotonic() + timeout
        with self.cond:
            while len([r for r in self.requests if 200 <= r.status < 300]) < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{len(self.requests)} requests, wanted {n} accepted")
                self.cond.wait(left)
        return self.accepted

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
