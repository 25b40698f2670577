"""Real processes for tests and benchmarks: daphne servers and agents on the live test DB.

``start_daphne(env)`` serves ``toolgate_site.asgi:application`` on a socket this
process bound (no port race), ``wait_ready`` waits until it answers, and
``start_agent(env)`` runs an agent process that gates calls on command and
reports when each waiter wakes. ``env`` is the environment a child needs (the
``child_env`` fixture in tests/conftest.py). ``approvals={...}`` overrides
``APPROVALS`` keys in the child, through a settings module written on the fly.

``python -m tests.procs agent`` is the agent itself: JSON lines on stdin
(``{"op": "gate", ...}``, ``{"op": "quit"}``), JSON lines on stdout
(``ready``, ``gated``, ``answer``, ``error``), times from ``time.monotonic()``,
which is one clock for every process on a Linux host.
"""

from __future__ import annotations

import atexit
import functools
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
_SETTINGS = """import json, os
from toolgate_site.settings import *  # noqa: F403
APPROVALS = {**APPROVALS, **json.loads(os.environ["TOOLGATE_PROC_APPROVALS"])}  # noqa: F405
"""


def child_environment(env: dict, approvals: dict | None = None) -> dict:
    """``env`` for a child, with ``APPROVALS`` overrides when given."""
    env = {**env, "PYTHONUNBUFFERED": "1", "TOOLGATE_QUIET": "1"}
    env.setdefault("DJANGO_SETTINGS_MODULE", "toolgate_site.settings")
    paths = [str(ROOT)]
    if approvals:
        folder = _settings_folder()
        paths.insert(0, str(folder))
        env["DJANGO_SETTINGS_MODULE"] = "toolgate_proc_settings"
        env["TOOLGATE_PROC_APPROVALS"] = json.dumps(approvals)
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")])
    return env


@functools.cache
def _settings_folder() -> Path:
    """One folder per test run holding the overriding settings module (removed at exit)."""
    folder = Path(tempfile.mkdtemp(prefix="toolgate-proc-"))
    (folder / "toolgate_proc_settings.py").write_text(_SETTINGS)
    atexit.register(shutil.rmtree, folder, True)
    return folder


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM when the parent dies (Linux), so no orphans."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def stop_process(proc: subprocess.Popen, timeout: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after ``timeout``; always reaps."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


# -- daphne ----------------------------------------------------------------


@dataclass
class Server:
    """A daphne process serving the site."""

    proc: subprocess.Popen
    url: str  # http://127.0.0.1:<port>
    port: int

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws/approvals/"

    @property
    def origin(self) -> str:
        return self.url

    def stop(self) -> None:
        stop_process(self.proc)


def start_daphne(
    env: dict, port: int = 0, *, approvals: dict | None = None, stderr: Any = None
) -> Server:
    """Start daphne on ``port`` (0: a free one, bound here and handed over as a descriptor);
    ``stderr``, when given, receives its log (a file or ``subprocess.PIPE``)."""
    command = [sys.executable, "-m", "daphne", "-v", "0"]
    listener = None
    if port:
        command += ["-b", "127.0.0.1", "-p", str(port)]
        fds: tuple = ()
    else:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(1024)
        port = listener.getsockname()[1]
        command += ["--fd", str(listener.fileno())]
        fds = (listener.fileno(),)
    command.append("toolgate_site.asgi:application")
    try:
        proc = subprocess.Popen(
            command,
            cwd=ROOT,
            env=child_environment(env, approvals),
            pass_fds=fds,
            preexec_fn=_die_with_parent,
            stderr=stderr,
        )
    finally:
        if listener is not None:
            listener.close()  # the child holds its own copy
    return Server(proc, f"http://127.0.0.1:{port}", port)


def wait_ready(server: Server, timeout: float = 60.0) -> Server:
    """Block until ``server`` answers HTTP (and has started its process listener)."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"daphne exited with {server.proc.returncode}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=2)
            conn.request("GET", "/admin/login/")
            status = conn.getresponse().status
            conn.close()
            if status < 500:
                return server
        except OSError as exc:
            last = exc
        time.sleep(0.05)
    raise TimeoutError(f"{server.url} not ready after {timeout}s ({last})")


# -- HTTP as a signed-in person -----------------------------------------------


class HttpClient:
    """A keep-alive HTTP connection carrying a session and a CSRF token."""

    def __init__(self, server: Server, sessionid: str) -> None:
        self.server = server
        self.csrf = secrets.token_hex(16)  # Django accepts a token the client makes up
        self.cookie = f"sessionid={sessionid}; csrftoken={self.csrf}"
        self.conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)

    def post_json(self, path: str, body: dict) -> tuple[int, dict]:
        data = json.dumps(body).encode()
        headers = {
            "Content-Type": "application/json",
            "Cookie": self.cookie,
            "X-CSRFToken": self.csrf,
            "Origin": self.server.origin,
        }
        self.conn.request("POST", path, body=data, headers=headers)
        response = self.conn.getresponse()
        return response.status, json.loads(response.read() or b"{}")

    def close(self) -> None:
        self.conn.close()


def ws_headers(server: Server, sessionid: str) -> dict:
    """Headers a browser on ``server``'s page would send when opening the socket."""
    return {"Origin": server.origin, "Cookie": f"sessionid={sessionid}"}


# -- the agent -----------------------------------------------------------------


@dataclass
class Agent:
    """An agent process; ``gate`` asks it to gate a call, ``answer`` waits for the outcome."""

    proc: subprocess.Popen
    lines: list[dict] = field(default_factory=list)
    cond: threading.Condition = field(default_factory=threading.Condition)

    def _read(self) -> None:
        for raw in self.proc.stdout:
            try:
                line = json.loads(raw)
            except ValueError:
                continue
            with self.cond:
                self.lines.append(line)
                self.cond.notify_all()
        with self.cond:
            self.lines.append({"event": "exit"})
            self.cond.notify_all()

    def expect(self, timeout: float = 10.0, **match: Any) -> dict:
        """The first line with all of ``match`` (waiting up to ``timeout``)."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for line in self.lines:
                    if all(line.get(k) == v for k, v in match.items()):
                        return line
                    if line.get("event") in ("exit", "error"):
                        raise RuntimeError(f"agent: {line}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"agent sent no {match} within {timeout}s")
                self.cond.wait(left)

    def send(self, **command: Any) -> None:
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()

    def gate(self, session_id: str, *, user_id: int | None = None, **details: Any) -> str:
        """Gate one call in the agent; returns its approval_id once the row is written."""
        return self.gate_timed(session_id, user_id=user_id, **details)["approval_id"]

    def gate_timed(
        self, session_id: str, *, user_id: int | None = None, approval_id: str = "", **details: Any
    ) -> dict:
        """Like :meth:`gate`, returning the ``gated`` line (``t0`` before, ``t`` after begin)."""
        aid = approval_id or secrets.token_urlsafe(24)
        self.send(op="gate", session_id=session_id, approval_id=aid, user_id=user_id, **details)
        return self.expect(event="gated", approval_id=aid)

    def answer(self, approval_id: str, timeout: float = 10.0) -> dict:
        """The agent's ``answer`` line for ``approval_id`` (``answer``, ``t``)."""
        return self.expect(timeout, event="answer", approval_id=approval_id)

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send(op="quit")
            except OSError:
                pass
        stop_process(self.proc)

    def kill(self) -> None:
        """SIGKILL: the process dies without cleaning anything up."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(5)


def start_agent(env: dict, *, approvals: dict | None = None, timeout: float = 30.0) -> Agent:
    """Start an agent process and wait until its listener runs (joined the layer group)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.procs", "agent"],
        cwd=ROOT,
        env=child_environment(env, approvals),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        bufsize=1,
        preexec_fn=_die_with_parent,
    )
    agent = Agent(proc)
    threading.Thread(target=agent._read, daemon=True).start()
    agent.expect(timeout, event="ready")
    return agent


def _agent_main() -> None:
    import django

    django.setup()
    from django.db import connection

    from approvals import gate
    from approvals.listener import get_listener

    lock = threading.Lock()

    def emit(**fields: Any) -> None:
        with lock:
            sys.stdout.write(json.dumps(fields) + "\n")
            sys.stdout.flush()

    def wait(slot: Any, aid: str) -> None:
        answer = gate.wait_tool_decision(slot, aid)
        woke = time.monotonic()  # ``t``: the wake, before the read below (a new connection)
        # What the agent would run: the person's edit if any, else the proposal.
        ran = gate.get_decision(aid).arguments if answer == "allow" else None
        # This thread's connection, closed by the thread that opened it. Left to
        # the garbage collector, finalizing it paused whatever this process ran
        # at that moment (the next gate: pauses of 2-10 ms, measured here).
        connection.close()
        emit(event="answer", approval_id=aid, answer=answer, arguments=ran, t=woke)

    listener = get_listener()
    link = listener.link
    emit(event="ready", pid=os.getpid(), key=listener.key, layer=bool(link and link.joined))
    for raw in sys.stdin:
        command = json.loads(raw)
        if command.get("op") == "quit":
            break
        started = time.monotonic()
        try:
            aid = command["approval_id"]
            slot = gate.begin_tool_decision(
                command["session_id"],
                aid,
                tool_name=command.get("tool_name", "shell"),
                arguments=command.get("arguments", {"cmd": "ls"}),
                user=command.get("user_id"),
                timeout=command.get("timeout"),
                description=command.get("description", ""),
                editable=command.get("editable", False),
                arguments_schema=command.get("arguments_schema"),
            )
        except Exception as exc:
            emit(event="error", detail=repr(exc))
            continue
        emit(event="gated", approval_id=aid, t0=started, t=time.monotonic())
        threading.Thread(target=wait, args=(slot, aid), daemon=True).start()


if __name__ == "__main__" and sys.argv[1:] == ["agent"]:
    _agent_main()
