"""Without Redis, the database itself says when to look: calls and decisions cross
processes through SQLite's ``data_version`` watcher or PostgreSQL's LISTEN/NOTIFY.

The re-check is set to a minute here, so only the fast path can deliver in time.
Figures are in BENCHMARKS.md (bench/cross_process.py); these tests check delivery.
"""

from __future__ import annotations

import json
import os
import time

import pytest
from django.db import connection
from django.test import Client
from websockets.sync.client import connect

from .conftest import database_url
from .procs import HttpClient, start_agent, start_daphne, wait_ready, ws_headers

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SLOW_RECHECK = {"RECHECK_INTERVAL": 60.0}


def _env() -> dict:
    env = {**os.environ, "DATABASE_URL": database_url(), "TOOLGATE_QUIET": "1"}
    env["DJANGO_SETTINGS_MODULE"] = "toolgate_site.settings"
    env.pop("REDIS_URL", None)
    return env


@pytest.fixture(scope="module")
def server(django_db_setup, django_db_blocker):
    """One daphne process without Redis, its re-check a minute apart."""
    with django_db_blocker.unblock():
        env = _env()
    found = start_daphne(env, approvals=SLOW_RECHECK)
    try:
        wait_ready(found)
    except BaseException:
        found.stop()
        raise
    yield found, env
    found.stop()


@pytest.fixture
def person(django_user_model):
    user = django_user_model.objects.create_user("alice")
    client = Client()
    client.force_login(user)
    return user, client.cookies["sessionid"].value


def _socket(server, sessionid):
    sock = connect(
        server.ws_url, additional_headers=ws_headers(server, sessionid), proxy=None, open_timeout=10
    )
    assert json.loads(sock.recv(timeout=10))["type"] == "snapshot"
    return sock


def _next(sock, kind, aid, timeout=10.0):
    deadline = time.monotonic() + timeout
    while True:
        message = json.loads(sock.recv(timeout=max(0.01, deadline - time.monotonic())))
        if message["type"] == kind and message.get("approval_id") == aid:
            return message


def _cross_both_ways(server, agent, sessionid, user):
    sock = _socket(server, sessionid)
    try:
        # Gated in the agent process: on the socket served by daphne.
        aid = agent.gate("s1", user_id=user.pk, tool_name="rm")
        assert _next(sock, "tool_start", aid)["tool_name"] == "rm"
        # Decided over the socket: the agent wakes.
        sock.send(json.dumps({"type": "tool_confirm", "approval_id": aid, "decision": "allow"}))
        assert _next(sock, "tool_confirm_result", aid)["resolved"] is True
        assert agent.answer(aid, timeout=10)["answer"] == "allow"
        # Decided over HTTP by a client with no socket: the agent wakes too.
        aid2 = agent.gate("s1", user_id=user.pk)
        _next(sock, "tool_start", aid2)
        http = HttpClient(server, sessionid)
        status, body = http.post_json(
            "/api/inference/tool-confirm", {"approval_id": aid2, "decision": "deny"}
        )
        http.close()
        assert (status, body["resolved"]) == (200, True)
        assert agent.answer(aid2, timeout=10)["answer"] == "deny"
    finally:
        sock.close()


def test_without_redis_the_database_watcher_carries_both_ways(server, person):
    (found, env), (user, sessionid) = server, person
    agent = start_agent(env, approvals=SLOW_RECHECK)
    try:
        _cross_both_ways(found, agent, sessionid, user)
    finally:
        agent.stop()


def _listening_backends() -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND query LIKE 'LISTEN toolgate_approvals%%' AND pid <> pg_backend_pid()"
        )
        return [row[0] for row in cursor.fetchall()]


def test_a_restarted_postgresql_listener_loses_nothing(server, person):
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only (set TOOLGATE_TEST_DATABASE_URL)")
    (found, env), (user, sessionid) = server, person
    agent = start_agent(env, approvals=SLOW_RECHECK)
    try:
        sock = _socket(found, sessionid)
        aid = agent.gate("s1", user_id=user.pk)
        _next(sock, "tool_start", aid)
        deadline = time.monotonic() + 10
        while len(killed := _listening_backends()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(killed) >= 2  # the daphne process and the agent process each listen
        with connection.cursor() as cursor:
            for pid in killed:
                cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        # Decided while nobody listens: the reconnect's catch-up read delivers it.
        sock.send(json.dumps({"type": "tool_confirm", "approval_id": aid, "decision": "allow"}))
        assert _next(sock, "tool_confirm_result", aid)["resolved"] is True
        assert agent.answer(aid, timeout=15)["answer"] == "allow"
        # And the fresh connections carry what comes next.
        _cross_both_ways(found, agent, sessionid, user)
        assert set(_listening_backends()).isdisjoint(killed)
        sock.close()
    finally:
        agent.stop()


def test_postgresql_notifications_carry_the_status_and_alone_wake_the_agent(server, person):
    """Notifications no longer kick a re-check pass: with the re-check a minute apart,
    the agent wakes from the payload itself."""
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only (set TOOLGATE_TEST_DATABASE_URL)")
    import psycopg

    from approvals.dbwatch import PG_CHANNEL
    from approvals.gate import resolve_tool_decision

    (_, env), (user, _) = server, person
    params = dict(connection.get_connection_params())
    for key in ("cursor_factory", "context", "server_side_binding", "prepare_threshold"):
        params.pop(key, None)
    agent = start_agent(env, approvals=SLOW_RECHECK)
    try:
        with psycopg.connect(**params, autocommit=True) as listening:
            listening.execute(f"LISTEN {PG_CHANNEL}")
            deadline = time.monotonic() + 10
            while len(_listening_backends()) < 3 and time.monotonic() < deadline:
                time.sleep(0.05)  # the agent's listener is up: its one catch-up read is done
            aid = agent.gate("s1", user_id=user.pk)
            assert resolve_tool_decision(aid, "deny")
            assert agent.answer(aid, timeout=10)["answer"] == "deny"
            payloads = [n.payload for n in listening.notifies(timeout=1, stop_after=2)]
        assert payloads == [f"{aid}:pending", f"{aid}:denied"]
    finally:
        agent.stop()
