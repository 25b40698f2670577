"""Faults: Redis dies, daphne dies, an agent dies, the database goes away for a moment.

* Redis stopped while agents wait and decisions are made: every decision still
  reaches its agent (the database re-check), sockets still see new calls, and
  once Redis is back the fast path returns by itself. This uses its own
  throwaway ``redis-server`` on a free port, never the shared one.
* daphne killed and restarted on the same port: a client that reconnects gets
  a snapshot with the call still pending, and a decision through the new
  process reaches the agent.
* an agent killed mid-wait: the sweep records ``abandoned``.
* the database unavailable (SQLite locked by another connection): the decision
  fails with a clear error, the row stays pending, no waiter wakes, no signal.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sqlite3
import subprocess
import threading
import time
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import OperationalError, connection
from django.test import Client
from websockets.sync.client import connect

from approvals import decisions, gate
from approvals.listener import get_listener
from approvals.models import Approval, Status
from approvals.signals import approval_decided

from .procs import HttpClient, start_agent, start_daphne, wait_ready, ws_headers

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
REDIS_SERVER = shutil.which("redis-server")
FAST = 0.15  # a channel-layer delivery; the re-check runs once a second


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def person(django_user_model):
    user = django_user_model.objects.create_user("alice")
    client = Client()
    client.force_login(user)
    return user, client.cookies["sessionid"].value


def ws_open(server, sessionid: str, timeout: float = 10.0):
    """Open the inbox socket, retrying while the server is (re)starting; returns the snapshot."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            sock = connect(
                server.ws_url,
                additional_headers=ws_headers(server, sessionid),
                proxy=None,
                open_timeout=5,
            )
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    snapshot = json.loads(sock.recv(timeout=10))
    assert snapshot["type"] == "snapshot"
    return sock, snapshot["pending"]


def ws_next(sock, kind: str, aid: str, timeout: float = 10.0) -> float:
    """Wait for a message of ``kind`` about ``aid``; the monotonic time it arrived."""
    deadline = time.monotonic() + timeout
    while True:
        message = json.loads(sock.recv(timeout=max(0.01, deadline - time.monotonic())))
        if message["type"] == kind and message.get("approval_id") == aid:
            return time.monotonic()


def decide_over_http(server, sessionid: str, aid: str, decision: str = "allow") -> float:
    http = HttpClient(server, sessionid)
    try:
        sent = time.monotonic()
        status, body = http.post_json(
            "/api/inference/tool-confirm", {"approval_id": aid, "decision": decision}
        )
        assert status == 200, body
        return sent
    finally:
        http.close()


# -- Redis goes away and comes back -----------------------------------------------


class ThrowawayRedis:
    """A redis-server of this test's own, on a free port, that can die and come back."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1"]
            + ["--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)


@pytest.fixture
def own_redis():
    if REDIS_SERVER is None:
        pytest.skip("needs redis-server on PATH (a throwaway one is started on a free port)")
    redis = ThrowawayRedis()
    redis.start()
    yield redis
    redis.kill()


services_only = pytest.mark.skipif(
    not os.environ.get("TOOLGATE_TEST_DATABASE_URL"),
    reason="runs in make test-services (set TOOLGATE_TEST_DATABASE_URL; .ci/run does)",
)


@pytest.fixture
def in_services_suite():
    if connection.vendor != "postgresql":
        pytest.skip("runs in make test-services (the session database is not PostgreSQL)")


@services_only
@pytest.mark.redis
@pytest.mark.usefixtures("in_services_suite")
def test_redis_dying_loses_no_decision_and_the_fast_path_comes_back(child_env, own_redis, person):
    user, sessionid = person
    env = {**child_env, "REDIS_URL": own_redis.url}
    server = wait_ready(start_daphne(env))
    agent = start_agent(env)
    try:
        sock, _ = ws_open(server, sessionid)
        before = [agent.gate("s-faults", user_id=user.pk) for _ in range(3)]
        for aid in before:
            ws_next(sock, "tool_start", aid)
        own_redis.kill()
        # Decisions made with Redis gone reach the agent through the database.
        for aid, decision in zip(before, ["allow", "deny", "allow"], strict=True):
            decide_over_http(server, sessionid, aid, decision)
            assert agent.answer(aid, timeout=10)["answer"] == decision
        # Calls gated meanwhile still reach the socket, and can be decided.
        during = agent.gate("s-faults", user_id=user.pk)
        ws_next(sock, "tool_start", during, timeout=10)
        decide_over_http(server, sessionid, during, "deny")
        assert agent.answer(during, timeout=10)["answer"] == "deny"
        assert _statuses(before + [during]) == ["allowed", "denied", "allowed", "denied"]

        own_redis.start()
        _until_fast(agent, server, sock, sessionid, user)
        # Five of seven fast (push and wake): the once-a-second re-check would
        # manage that by luck about once in a million runs.
        fast = [max(_round_trip(agent, server, sock, sessionid, user)) < FAST for _ in range(7)]
        assert sum(fast) >= 5, fast
        sock.close()
    finally:
        agent.stop()
        server.stop()


def _round_trip(agent, server, sock, sessionid, user) -> tuple[float, float]:
    """Gate in the agent, see it on the socket, decide over HTTP: (push delay, wake delay)."""
    gated = agent.gate_timed("s-faults", user_id=user.pk)
    aid = gated["approval_id"]
    seen = ws_next(sock, "tool_start", aid)
    sent = decide_over_http(server, sessionid, aid)
    woke = agent.answer(aid)["t"]
    return seen - gated["t"], woke - sent


def _until_fast(agent, server, sock, sessionid, user, within: float = 45.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if max(_round_trip(agent, server, sock, sessionid, user)) < FAST:
            return
    raise AssertionError(f"the channel-layer path did not come back within {within:.0f}s")


def _statuses(aids: list[str]) -> list[str]:
    rows = dict(Approval.objects.filter(approval_id__in=aids).values_list("approval_id", "status"))
    return [rows[a] for a in aids]


# -- daphne dies -------------------------------------------------------------------


@services_only
@pytest.mark.usefixtures("in_services_suite")
def test_daphne_killed_and_restarted_clients_reconnect_to_a_snapshot(child_env, person):
    user, sessionid = person
    port = free_port()
    server = wait_ready(start_daphne(child_env, port=port))
    agent = start_agent(child_env)
    try:
        sock, _ = ws_open(server, sessionid)
        aid = agent.gate("s-faults", user_id=user.pk)
        ws_next(sock, "tool_start", aid)
        server.proc.kill()
        server.proc.wait(5)
        with pytest.raises(Exception):  # noqa: B017 (any closed-connection error)
            sock.recv(timeout=5)
        server = start_daphne(child_env, port=port)
        sock, pending = ws_open(server, sessionid, timeout=60)
        assert [item["approval_id"] for item in pending] == [aid]
        decide_over_http(wait_ready(server), sessionid, aid, "deny")
        assert agent.answer(aid, timeout=10)["answer"] == "deny"
        ws_next(sock, "tool_decision", aid)
        sock.close()
    finally:
        agent.stop()
        server.stop()


# -- an agent dies -----------------------------------------------------------------


def test_an_agent_killed_mid_wait_is_recorded_abandoned_by_the_sweep(child_env, person):
    user, _ = person
    agent = start_agent(child_env, approvals={"HEARTBEAT_INTERVAL": 0.2})
    aid = agent.gate("s-faults", user_id=user.pk)
    agent.kill()
    call_command("approvals_sweep", lease_timeout=30, stdout=_Quiet())
    assert Approval.objects.get(approval_id=aid).status == Status.PENDING  # lease still fresh
    time.sleep(1.5)
    call_command("approvals_sweep", lease_timeout=1.0, stdout=_Quiet())
    row = Approval.objects.get(approval_id=aid)
    assert (row.status, row.decided_via) == (Status.ABANDONED, "sweep")
    assert gate.denial_message(aid) == gate.ABANDONED_MESSAGE
    assert gate.resolve_tool_decision(aid, "allow", user=user) is False


class _Quiet:
    def write(self, *args, **kwargs) -> None:
        pass

    def flush(self) -> None:
        pass


# -- the database goes away -----------------------------------------------------------


@pytest.fixture
def db_locked():
    """Lock the approvals table from another connection; this one gives up after 100 ms.

    SQLite: another connection holds the write lock (``BEGIN EXCLUSIVE``).
    PostgreSQL: another connection holds ``ACCESS EXCLUSIVE`` on the table.
    """
    connection.ensure_connection()
    other, lock_sql, unlock_sql = _other_connection()
    state = {"locked": False}

    def lock() -> None:
        for sql in lock_sql:
            other.execute(sql)
        state["locked"] = True

    def unlock() -> None:
        if state["locked"]:
            other.execute(unlock_sql)
            state["locked"] = False

    yield lock, unlock
    unlock()
    other.close()
    _wait_limit(None)


def _other_connection():
    _wait_limit(0.1)
    s = connection.settings_dict
    if connection.vendor == "sqlite":
        other = sqlite3.connect(Path(s["NAME"]), timeout=0.1, isolation_level=None)
        return other, ["BEGIN EXCLUSIVE"], "ROLLBACK"
    if connection.vendor == "postgresql":
        import psycopg

        other = psycopg.connect(
            dbname=s["NAME"],
            user=s["USER"] or None,
            password=s["PASSWORD"] or None,
            host=s["HOST"] or None,
            port=s["PORT"] or None,
            autocommit=True,
        )
        table = Approval._meta.db_table
        return other, ["BEGIN", f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"], "ROLLBACK"
    pytest.skip(f"no lock recipe for {connection.vendor}")


def _wait_limit(seconds: float | None) -> None:
    """How long this connection waits for a lock (None: the site's default)."""
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute(f"PRAGMA busy_timeout={int((seconds or 20) * 1000)}")
        elif connection.vendor == "postgresql":
            cursor.execute(f"SET lock_timeout = {int((seconds or 0) * 1000)}")


def test_a_locked_database_fails_the_decision_cleanly(person, db_locked):
    user, _ = person
    lock, unlock = db_locked
    aid = gate.new_approval_id()
    slot = gate.begin_tool_decision("s-faults", aid, user=user, tool_name="shell")
    fired: list = []
    receiver = lambda sender, approval, **kw: fired.append(approval.approval_id)  # noqa: E731
    approval_decided.connect(receiver)
    try:
        lock()
        with pytest.raises(OperationalError, match="lock"):
            decisions.decide(aid, Status.ALLOWED, via="api", by=user)
        assert slot.status is None and not fired  # nobody woken, nothing announced
        unlock()
        assert Approval.objects.get(approval_id=aid).status == Status.PENDING
        # Once the database is back, the same decision goes through once.
        waiter = threading.Thread(target=lambda: fired.append(gate.wait_tool_decision(slot, aid)))
        waiter.start()
        assert gate.resolve_tool_decision(aid, "allow", user=user) is True
        waiter.join(5)
        assert sorted(fired) == sorted([aid, "allow"])  # one signal, one waiter answer
    finally:
        approval_decided.disconnect(receiver)
        get_listener().unregister(slot)


def test_a_locked_database_answers_http_with_a_clear_503(person, db_locked):
    user, sessionid = person
    lock, unlock = db_locked
    aid = gate.new_approval_id()
    get_listener().unregister(gate.begin_tool_decision("s-faults", aid, user=user))
    client = Client(raise_request_exception=False)
    client.cookies["sessionid"] = sessionid
    lock()
    try:
        response = client.post(
            "/api/inference/tool-confirm",
            {"approval_id": aid, "decision": "allow"},
            content_type="application/json",
        )
    finally:
        unlock()
    assert response.status_code == 503, response.content[:200]
    body = response.json()
    assert body["resolved"] is False and body["error"] and body["detail"]
    assert Approval.objects.get(approval_id=aid).status == Status.PENDING
