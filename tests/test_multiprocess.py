"""Several real processes behave as one site: daphne servers, agent processes, one database.

Without Redis the database re-check carries calls and decisions between
processes (about a second). With Redis and PostgreSQL (``make test-services``)
the channel layer carries them in milliseconds; there the re-check is set to a
minute so only the fast path can pass the timing assertions.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
import subprocess
import time

import pytest
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.db import connection
from django.test import Client
from websockets.sync.client import connect

from approvals.models import Approval

from .conftest import database_url
from .procs import HttpClient, start_agent, start_daphne, wait_ready, ws_headers

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _env(*, redis: bool) -> dict:
    env = {**os.environ, "DATABASE_URL": database_url(), "TOOLGATE_QUIET": "1"}
    env["DJANGO_SETTINGS_MODULE"] = "toolgate_site.settings"
    if redis:
        env["REDIS_URL"] = os.environ["TOOLGATE_TEST_REDIS_URL"]
    else:
        env.pop("REDIS_URL", None)
    return env


def _start_servers(count: int, env: dict, approvals: dict | None = None) -> list:
    servers = [start_daphne(env, approvals=approvals) for _ in range(count)]
    try:
        return [wait_ready(s) for s in servers]
    except BaseException:
        for s in servers:
            s.stop()
        raise


@pytest.fixture(scope="module")
def embedded_server(django_db_setup, django_db_blocker):
    """One daphne process on the test database and the in-memory layer (no Redis)."""
    with django_db_blocker.unblock():
        env = _env(redis=False)
    (server,) = _start_servers(1, env)
    yield server, env
    server.stop()


SLOW_RECHECK = {"RECHECK_INTERVAL": 60.0}


@pytest.fixture(scope="module")
def scaled_servers(django_db_setup, django_db_blocker):
    """Two daphne processes on PostgreSQL and Redis, with the re-check out of the way."""
    if not os.environ.get("TOOLGATE_TEST_DATABASE_URL"):
        pytest.skip("set TOOLGATE_TEST_DATABASE_URL (PostgreSQL) to run; .ci/run does")
    if not os.environ.get("TOOLGATE_TEST_REDIS_URL"):
        pytest.skip("set TOOLGATE_TEST_REDIS_URL (Redis) to run; .ci/run does")
    with django_db_blocker.unblock():
        if connection.vendor != "postgresql":
            pytest.skip("runs in make test-services (the session database is not PostgreSQL)")
        env = _env(redis=True)
    servers = _start_servers(2, env, SLOW_RECHECK)
    yield servers, env
    for s in servers:
        s.stop()


@pytest.fixture
def person(django_user_model):
    user = django_user_model.objects.create_user("alice")
    client = Client()
    client.force_login(user)
    return user, client.cookies["sessionid"].value


def _socket(server, sessionid, query=""):
    sock = connect(
        server.ws_url + query,
        additional_headers=ws_headers(server, sessionid),
        proxy=None,
        open_timeout=10,
    )
    first = json.loads(sock.recv(timeout=10))
    assert first["type"] == "snapshot"
    return sock, first["pending"]


def _next(sock, kind, timeout=5.0, aid=None):
    deadline = time.monotonic() + timeout
    while True:
        message = json.loads(sock.recv(timeout=max(0.01, deadline - time.monotonic())))
        if message["type"] == kind and aid in (None, message.get("approval_id")):
            return message


def _confirm(sock, aid, decision, **extra):
    sock.send(
        json.dumps({"type": "tool_confirm", "approval_id": aid, "decision": decision, **extra})
    )
    return _next(sock, "tool_confirm_result", aid=aid)


# -- the embedded default: no Redis ---------------------------------------------


def test_without_redis_calls_and_decisions_cross_processes_through_the_recheck(
    embedded_server, person
):
    server, env = embedded_server
    user, sessionid = person
    agent = start_agent(env)
    try:
        sock, pending = _socket(server, sessionid)
        assert pending == []
        # A call gated in the agent process shows on a socket served by daphne.
        aid = agent.gate("s1", user_id=user.pk, tool_name="rm")
        gated = time.monotonic()
        started = _next(sock, "tool_start", timeout=5)
        assert (started["approval_id"], started["tool_name"]) == (aid, "rm")
        assert time.monotonic() - gated < 2.5  # about the re-check interval (1 s)
        # A decision over the socket reaches the waiter in the other process.
        decided = time.monotonic()
        assert _confirm(sock, aid, "allow")["resolved"] is True
        woke = agent.answer(aid)
        assert woke["answer"] == "allow"
        assert woke["t"] - decided < 2.5
        # And over HTTP, from a client that has no socket at all.
        aid2 = agent.gate("s1", user_id=user.pk)
        http = HttpClient(server, sessionid)
        decided = time.monotonic()
        status, body = http.post_json(
            "/api/inference/tool-confirm", {"approval_id": aid2, "decision": "deny"}
        )
        http.close()
        assert (status, body["resolved"], body["status"]) == (200, True, "denied")
        woke = agent.answer(aid2)
        assert woke["answer"] == "deny" and woke["t"] - decided < 2.5
        sock.close()
    finally:
        agent.stop()
    assert Approval.objects.get(approval_id=aid).decided_via == "websocket"
    assert Approval.objects.get(approval_id=aid2).decided_via == "web"


def test_sigkilled_agent_leaves_its_call_abandoned_after_the_sweep(embedded_server, person):
    server, env = embedded_server
    user, sessionid = person
    agent = start_agent(env)
    aid = agent.gate("s1", user_id=user.pk)
    agent.kill()
    sock, pending = _socket(server, sessionid)
    assert [p["approval_id"] for p in pending] == [aid]  # nobody knows yet
    out = io.StringIO()
    call_command("approvals_sweep", lease_timeout=60, stdout=out)
    assert "abandoned 0" in out.getvalue()
    assert Approval.objects.get(approval_id=aid).status == "pending"  # the lease is fresh
    time.sleep(1.1)
    call_command("approvals_sweep", lease_timeout=1, stdout=out)
    assert "abandoned 1" in out.getvalue()
    row = Approval.objects.get(approval_id=aid)
    assert (row.status, row.decided_via) == ("abandoned", "sweep")
    pushed = _next(sock, "tool_decision", timeout=5)
    assert (pushed["approval_id"], pushed["status"]) == (aid, "abandoned")
    result = _confirm(sock, aid, "allow")
    assert (result["resolved"], result["error"], result["status"]) == (
        False,
        "already_decided",
        "abandoned",
    )
    sock.close()


def test_the_listener_sweeps_by_itself(person, django_db_blocker):
    """No cron needed: a server with a short SWEEP_INTERVAL abandons the dead agent's call."""
    user, sessionid = person
    env = _env(redis=False)
    (server,) = _start_servers(1, env, {"SWEEP_INTERVAL": 0.5, "LEASE_TIMEOUT": 1.0})
    try:
        agent = start_agent(env)
        aid = agent.gate("s1", user_id=user.pk)
        agent.kill()
        sock, _ = _socket(server, sessionid)  # starts the server's listener
        pushed = _next(sock, "tool_decision", timeout=8)
        assert (pushed["approval_id"], pushed["status"], pushed["decided_via"]) == (
            aid,
            "abandoned",
            "sweep",
        )
        sock.close()
    finally:
        server.stop()


# -- the scaled setup: PostgreSQL + Redis, two servers ------------------------------


@pytest.mark.postgres
@pytest.mark.redis
def test_with_redis_two_servers_and_an_agent_behave_as_one_site(scaled_servers, person):
    (server_a, server_b), env = scaled_servers
    user, sessionid = person
    boss = type(user).objects.create_user("boss")
    boss.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    boss_client = Client()
    boss_client.force_login(boss)
    boss_session = boss_client.cookies["sessionid"].value
    agent = start_agent(env, approvals=SLOW_RECHECK)
    try:
        assert agent.expect(event="ready")["layer"] is True
        on_b, _ = _socket(server_b, sessionid)
        on_a, _ = _socket(server_a, boss_session)
        # Gated in the agent: on B's socket in milliseconds (the re-check is a minute).
        aid = agent.gate("s1", user_id=user.pk)
        gated = time.monotonic()
        assert _next(on_b, "tool_start", timeout=2)["approval_id"] == aid
        assert time.monotonic() - gated < 0.5
        # A POST on server A wakes the agent.
        http = HttpClient(server_a, sessionid)
        sent = time.monotonic()
        status, body = http.post_json(
            "/api/inference/tool-confirm", {"approval_id": aid, "decision": "allow"}
        )
        assert (status, body["resolved"]) == (200, True)
        assert agent.answer(aid, timeout=2)["t"] - sent < 0.5
        assert _next(on_b, "tool_decision", timeout=2)["status"] == "allowed"
        # A decision over a socket on A (by a decider) reaches the agent and B.
        aid2 = agent.gate("s1", user_id=user.pk)
        assert _next(on_a, "tool_start", timeout=2, aid=aid2)
        sent = time.monotonic()
        assert _confirm(on_a, aid2, "deny", reason="no")["resolved"] is True
        woke = agent.answer(aid2, timeout=2)
        assert woke["answer"] == "deny" and woke["t"] - sent < 0.5
        decided = _next(on_b, "tool_decision", timeout=2, aid=aid2)
        assert (decided["status"], decided["decided_by"]) == ("denied", "boss")
        # The second decision on another server loses, as on one server.
        status, body = http.post_json(
            "/api/inference/tool-confirm", {"approval_id": aid2, "decision": "allow"}
        )
        assert (status, body["error"], body["status"]) == (409, "already_decided", "denied")
        http.close()
        on_a.close()
        on_b.close()
    finally:
        agent.stop()


@pytest.mark.redis
@pytest.mark.skipif(not shutil.which("redis-server"), reason="needs the redis-server binary")
def test_the_fast_path_comes_back_after_a_redis_restart(person, tmp_path):
    """A private Redis is killed and restarted; calls and decisions are fast again at once."""
    user, sessionid = person
    port = _free_port()
    redis = _redis_server(port, tmp_path)
    env = {**_env(redis=False), "REDIS_URL": f"redis://127.0.0.1:{port}/0"}
    server = agent = None
    try:
        (server,) = _start_servers(1, env, SLOW_RECHECK)
        agent = start_agent(env, approvals=SLOW_RECHECK)
        sock, _ = _socket(server, sessionid)
        aid = agent.gate("s1", user_id=user.pk)
        _next(sock, "tool_start", timeout=2, aid=aid)
        redis.kill()
        redis.wait(5)
        redis = _redis_server(port, tmp_path)
        # Within seconds, not the minute-long re-check: both sides reconnected.
        deadline = time.monotonic() + 15
        while True:
            aid = agent.gate("s1", user_id=user.pk)
            try:
                _next(sock, "tool_start", timeout=1, aid=aid)
                break
            except TimeoutError:
                assert time.monotonic() < deadline, "the layer did not come back"
        assert _confirm(sock, aid, "allow")["resolved"] is True
        assert agent.answer(aid, timeout=3)["answer"] == "allow"
        sock.close()
    finally:
        for proc in (agent, server):
            if proc is not None:
                proc.stop()
        redis.kill()
        redis.wait(5)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _redis_server(port: int, folder) -> subprocess.Popen:
    proc = subprocess.Popen(
        [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(folder),
        ],
        stdout=subprocess.DEVNULL,
    )
    for _ in range(100):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("redis-server did not start")


def test_a_bad_group_prefix_is_refused_clearly():
    from django.core.exceptions import ImproperlyConfigured

    from approvals.channellink import LayerLink

    for bad in ("has space", "a:b", "x" * 95):
        with pytest.raises(ImproperlyConfigured, match="GROUP_PREFIX"):
            LayerLink(object(), f"{bad}.events", lambda m: None)
    LayerLink(object(), "approvals.events", lambda m: None)  # the default is fine


def test_a_process_never_sweeps_away_its_own_waiting_calls(settings):
    """Even if its lease row vanished (a flush, a restored backup): it is alive."""
    from approvals import gate
    from approvals.listener import get_listener
    from approvals.models import ProcessLease

    aid = gate.new_approval_id()
    slot = gate.begin_tool_decision("s1", aid, tool_name="shell")
    try:
        ProcessLease.objects.all().delete()
        settings.APPROVALS = {"SWEEP_INTERVAL": 0.1, "LEASE_TIMEOUT": 0.2, "RECHECK_INTERVAL": 0.05}
        time.sleep(0.3)
        get_listener()._kick.set()
        time.sleep(0.5)
        assert Approval.objects.get(approval_id=aid).status == "pending"
        assert ProcessLease.objects.filter(key=get_listener().key).exists()
    finally:
        gate.abort_tool_decision(slot, aid)
