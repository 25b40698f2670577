"""A real toolgate for the client tests: daphne serving this repository's site.

The tests run in a virtual environment that need not have Django; the server
side runs with ``$TOOLGATE_SERVER_PYTHON`` (default: the repository's
``.venv/bin/python``), on a fresh database migrated for the run (a SQLite file;
with ``$DATABASE_URL`` a PostgreSQL database of its own, ``<TOOLGATE_TEST_DB_NAME>_client``
on that server, and ``$REDIS_URL`` for the channel layer), with ``DJANGO_DEBUG=0`` and
a secret key of the run's own.

In front of daphne sits a small HTTP proxy of this process: it logs every
request (``requests``, ``queries``, :meth:`count`), answers chosen ones with a
5xx (:meth:`fail_next`), and drops connections while daphne is down
(:meth:`stop` kills daphne, :meth:`start` starts it again on the same port), so
the client sees what it would see of a real restart. Calls are decided the way a
person decides them: ``POST tool-confirm`` with a signed-in session (the user's
own, made by ``server_control.py``); keys come from ``manage.py
approvals_agent_key``.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import http.client
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit, urlunsplit

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
API = "/api/inference/"
SETTINGS = """from toolgate_site.settings import *  # noqa: F403
APPROVALS = {**APPROVALS, "RECHECK_INTERVAL": 0.2, "SWEEP_INTERVAL": 0.5}  # noqa: F405
"""


def server_python() -> str:
    return os.environ.get("TOOLGATE_SERVER_PYTHON") or str(ROOT / ".venv" / "bin" / "python")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _die_with_parent() -> None:
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)


class Control:
    """``server_control.py`` in the server's interpreter: JSON lines in and out."""

    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [server_python(), str(HERE / "server_control.py")],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
            preexec_fn=_die_with_parent,
        )
        self.lock = threading.Lock()
        self._read()

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("server_control.py exited")
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"server_control.py: {answer['error']}")
        return answer

    def __call__(self, op: str, **fields: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        with self.lock:
            self.proc.stdin.write(json.dumps({"op": op, **fields}) + "\n")
            self.proc.stdin.flush()
            return self._read()

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class ToolgateServer:
    """daphne + the proxy; ``url`` is what a client is given."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="toolgate-client-tests-"))
        self.env = self._environment()
        self.daphne: subprocess.Popen[bytes] | None = None
        self.daphne_port = _free_port()
        self.proxy = FaultProxy(self)
        self.keys: dict[str, str] = {}
        self._sessions: dict[str, str] = {}
        atexit.register(self.stop)  # daphne has no parent-death signal (see start)

    # -- set-up ---------------------------------------------------------------------

    def _environment(self) -> dict[str, str]:
        (self.folder / "toolgate_client_test_settings.py").write_text(SETTINGS)
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("DJANGO_", "DATABASE_URL", "REDIS_URL", "VIRTUAL_ENV"))
        }
        env.update(
            DJANGO_SETTINGS_MODULE="toolgate_client_test_settings",
            DJANGO_SECRET_KEY="client-tests-" + secrets.token_urlsafe(32),
            DJANGO_DEBUG="0",
            TOOLGATE_QUIET="1",
            PYTHONUNBUFFERED="1",
            PYTHONPATH=os.pathsep.join([str(self.folder), str(ROOT)]),
            TOOLGATE_GROUP_PREFIX=f"client-{secrets.token_hex(4)}",
        )
        database = os.environ.get("DATABASE_URL")  # as the server's own suite: PostgreSQL
        if database:
            name = os.environ.get("TOOLGATE_TEST_DB_NAME", "test") + "_client"
            env["DATABASE_URL"] = urlunsplit(urlsplit(database)._replace(path="/" + name))
            self._fresh_postgres(database, name, env)
        else:
            env["DATABASE_URL"] = f"sqlite:///{self.folder / 'db.sqlite3'}"
        if os.environ.get("REDIS_URL"):
            env["REDIS_URL"] = os.environ["REDIS_URL"]
        return env

    @staticmethod
    def _fresh_postgres(url: str, name: str, env: dict[str, str]) -> None:
        script = (
            "import sys, psycopg\n"
            "with psycopg.connect(sys.argv[1], autocommit=True) as c:\n"
            "    c.execute(f'DROP DATABASE IF EXISTS \"{sys.argv[2]}\" WITH (FORCE)')\n"
            "    c.execute(f'CREATE DATABASE \"{sys.argv[2]}\"')\n"
        )
        subprocess.run([server_python(), "-c", script, url, name], env=env, check=True)

    def manage(self, *args: str) -> str:
        done = subprocess.run(
            [server_python(), "manage.py", *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode:
            raise RuntimeError(f"manage.py {' '.join(args)}: {done.stderr}")
        return done.stdout

    def setup(self) -> None:
        self.manage("migrate", "--noinput", "-v", "0")
        self.control = Control(self.env)
        for name in ("alice", "bob"):
            self.control("user", username=name)
        # The command an operator uses: the key is alone on the last line.
        out = self.manage("approvals_agent_key", "create", "--user", "alice", "--name", "alice-bot")
        self.keys["alice"] = out.strip().splitlines()[-1]
        self.keys["bob"] = self.control("key", username="bob", name="bob-bot")["key"]
        self.start()
        self.proxy.start()

    def close(self) -> None:
        self.proxy.close()
        self.stop()
        self.control.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    # -- daphne ---------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.proxy.port}{API}"

    def start(self, timeout: float = 120) -> None:
        """Start daphne (again) on its port and wait until it answers."""
        command = [server_python(), "-m", "daphne", "-v", "0", "-b", "127.0.0.1"]
        command += ["-p", str(self.daphne_port), "toolgate_site.asgi:application"]
        # No parent-death signal here: it follows the starting *thread*, and a test may
        # restart daphne from a worker thread that ends long before daphne should.
        self.daphne = subprocess.Popen(command, cwd=ROOT, env=self.env, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.daphne.poll() is not None:
                raise RuntimeError(f"daphne exited with {self.daphne.returncode}")
            with contextlib.suppress(OSError):
                if self._direct("GET", API + "approvals/x")[0] == 401:
                    return
            time.sleep(0.1)
        raise TimeoutError("daphne did not answer")

    def stop(self) -> None:
        """Kill daphne: held long-polls drop; the database keeps every call."""
        if self.daphne is not None and self.daphne.poll() is None:
            self.daphne.kill()
            self.daphne.wait(10)
        self.daphne = None

    def _direct(self, method: str, path: str, body: Any = None, headers: Any = None) -> tuple:
        conn = http.client.HTTPConnection("127.0.0.1", self.daphne_port, timeout=30)
        try:
            data = None if body is None else json.dumps(body).encode()
            conn.request(method, path, body=data, headers=headers or {})
            response = conn.getresponse()
            return response.status, json.loads(response.read() or b"{}")
        finally:
            conn.close()

    # -- what a person does -------------------------------------------------------

    def decide(
        self,
        approval_id: str,
        decision: str,
        *,
        reason: str = "",
        arguments: dict[str, Any] | None = None,
        user: str = "alice",
    ) -> bool:
        """Allow or deny through ``POST tool-confirm`` as ``user``; ``True`` if it won."""
        if user not in self._sessions:
            self._sessions[user] = self.control("session", username=user)["sessionid"]
        csrf = secrets.token_hex(16)
        body: dict[str, Any] = {"approval_id": approval_id, "decision": decision}
        if reason:
            body["reason"] = reason
        if arguments is not None:
            body["arguments"] = arguments
        origin = f"http://127.0.0.1:{self.daphne_port}"
        headers = {
            "Content-Type": "application/json",
            "Cookie": f"sessionid={self._sessions[user]}; csrftoken={csrf}",
            "X-CSRFToken": csrf,
            "Origin": origin,
        }
        status, answer = self._direct("POST", API + "tool-confirm", body, headers)
        return status == 200 and bool(answer.get("resolved"))

    def new_key(self, name: str, user: str = "alice") -> str:
        return self.control("key", username=user, name=name)["key"]

    def revoke(self, name: str) -> None:
        self.manage("approvals_agent_key", "revoke", name)

    # -- what the tests look at -----------------------------------------------------

    @property
    def calls(self) -> dict[str, SimpleNamespace]:
        rows = self.control("calls")["calls"]
        return {row["approval_id"]: SimpleNamespace(**row) for row in rows}

    def wait_for_pending(self, timeout: float = 30, count: int = 1) -> list[SimpleNamespace]:
        deadline = time.monotonic() + timeout
        while True:
            pending = [c for c in self.calls.values() if c.status == "pending"]
            if len(pending) >= count:
                return pending
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(pending)} pending calls after {timeout} s")
            time.sleep(0.05)

    def wait_for_status(self, approval_id: str, status: str, timeout: float = 30) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            call = self.calls.get(approval_id)
            if call is not None and call.status == status:
                return call
            if time.monotonic() > deadline:
                raise TimeoutError(f"{approval_id} is not {status} after {timeout} s")
            time.sleep(0.05)

    @property
    def requests(self) -> list[tuple[str, str, int]]:
        return list(self.proxy.log)

    @property
    def queries(self) -> list[str]:
        return [p.partition("?")[2] for m, p, _ in self.proxy.log if m == "GET" and "?" in p]

    def count(self, method: str, path_part: str = "") -> int:
        return sum(1 for m, p, _ in self.proxy.log if m == method and path_part in p)

    def fail_next(self, count: int, status: int = 503, path: str = "") -> None:
        """Answer the next ``count`` requests whose path holds ``path`` with ``status``."""
        with self.proxy.lock:
            self.proxy.failures.extend([(status, path)] * count)

    def reset(self) -> None:
        """Between tests: no calls, no log, no pending failures, daphne up."""
        if self.daphne is None:
            self.start()
        with self.proxy.lock:
            self.proxy.log.clear()
            self.proxy.failures.clear()
        self.control("reset")


class FaultProxy:
    """HTTP/1.1 keep-alive in front of daphne: logs, injects 5xx, drops while it is down.

    One event loop on one thread (started before any test counts threads), a
    fresh upstream connection per request. ``log`` holds ``(method, path,
    injected status or 0)`` per request.
    """

    HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "te", "upgrade"}

    def __init__(self, server: ToolgateServer) -> None:
        self.server = server
        self.lock = threading.Lock()
        self.log: list[tuple[str, str, int]] = []
        self.failures: list[tuple[int, str]] = []
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.loop = asyncio.new_event_loop()

    def start(self) -> None:
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self.loop)

            async def serve() -> None:
                await asyncio.start_server(self._serve, sock=self.listener, backlog=128)
                ready.set()

            self.loop.run_until_complete(serve())
            self.loop.run_forever()

        threading.Thread(target=run, daemon=True).start()
        ready.wait(10)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await self._one(reader, writer):
                pass
        except (OSError, ValueError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        line = await reader.readline()
        if not line:
            return False
        method, path, _ = line.decode("latin-1").split(" ", 2)
        headers = await _read_headers(reader)
        length = int(next((v for k, v in headers if k.lower() == "content-length"), "0"))
        body = await reader.readexactly(length) if length else b""
        injected = self._injected(path)
        with self.lock:
            self.log.append((method, path, injected))
        if injected:
            data = json.dumps({"error": "unavailable", "detail": "injected by the test"}).encode()
            await _write(writer, injected, [("Content-Type", "application/json")], data)
            return True
        if self.server.daphne is None:
            return False  # daphne is down: the connection drops
        kept = [(k, v) for k, v in headers if k.lower() not in self.HOP]
        try:
            status, out, data = await self._forward(method, path, kept, body)
        except (OSError, ValueError, asyncio.IncompleteReadError):
            return False  # daphne went away mid-request: so does this connection
        await _write(writer, status, out, data)
        return True

    async def _forward(self, method: str, path: str, headers: list, body: bytes) -> tuple:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.server.daphne_port)
        try:
            head = [f"{method} {path} HTTP/1.1", *(f"{k}: {v}" for k, v in headers)]
            head += [f"Content-Length: {len(body)}", "Connection: close", "", ""]
            writer.write("\r\n".join(head).encode("latin-1") + body)
            status = int((await reader.readline()).split()[1])
            answer = await _read_headers(reader)
            names = {k.lower(): v for k, v in answer}
            if "content-length" in names:
                data = await reader.readexactly(int(names["content-length"]))
            elif names.get("transfer-encoding", "").lower() == "chunked":
                data = await _dechunk(reader)
            else:
                data = await reader.read()
            return status, [(k, v) for k, v in answer if k.lower() not in self.HOP], data
        finally:
            writer.close()

    def _injected(self, path: str) -> int:
        with self.lock:
            for i, (status, part) in enumerate(self.failures):
                if part in path:
                    del self.failures[i]
                    return status
        return 0


async def _read_headers(reader: asyncio.StreamReader) -> list[tuple[str, str]]:
    headers = []
    while (raw := await reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = raw.decode("latin-1").partition(":")
        headers.append((name.strip(), value.strip()))
    return headers


async def _dechunk(reader: asyncio.StreamReader) -> bytes:
    data = b""
    while size := int((await reader.readline()).split(b";")[0], 16):
        data += await reader.readexactly(size)
        await reader.readline()
    await _read_headers(reader)  # trailers
    return data


async def _write(writer: asyncio.StreamWriter, status: int, headers: list, data: bytes) -> None:
    head = [f"HTTP/1.1 {status} {http.client.responses.get(status, 'Status')}"]
    head += [f"{k}: {v}" for k, v in headers]
    head += [f"Content-Length: {len(data)}", "", ""]
    writer.write("\r\n".join(head).encode("latin-1") + data)
    await writer.drain()


def main() -> None:  # pragma: no cover - a manual check: python realserver.py
    server = ToolgateServer()
    server.setup()
    print(server.url, server.keys, file=sys.stderr)
    try:
        input("serving; Enter to stop\n")
    finally:
        server.close()


if __name__ == "__main__":
    main()

#: What the server feeds the model for a denied call (``approvals.gate``).
DENIED = "The user declined to run this tool call."
