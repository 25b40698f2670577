"""The agent API against a real daphne: keys, every endpoint, waits that survive a restart.

One daphne serves each test (the embedded default: SQLite, in-memory layer), so
a decision made in this test process reaches it through its database re-check
(``RECHECK_INTERVAL``), one made through its own endpoints at once.
"""

from __future__ import annotations

import http.client
import json
import secrets
import threading
import time

import pytest

from approvals import agentkeys, gate
from approvals.models import AgentKey, Approval, Rule

from .procs import HttpClient, start_daphne, stop_process, wait_ready

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
API = "/api/inference/approvals"
FAST = {"RECHECK_INTERVAL": 0.2, "SWEEP_INTERVAL": 0.5, "AGENT_LEASE_TIMEOUT": 2.0}


def call(server, method, path, body=None, key=None, timeout=70):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = None if body is None else json.dumps(body).encode("utf-8", "surrogatepass")
    try:
        conn.request(method, path, body=data, headers=headers)
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"{}")
    finally:
        conn.close()


@pytest.fixture
def site(child_env):
    server = wait_ready(start_daphne(child_env, approvals=FAST))
    yield server
    server.stop()


@pytest.fixture
def alice(django_user_model):
    user = django_user_model.objects.create_user("alice", password="pw")
    return user, agentkeys.create_key(user, "alice-bot")[1]


def gate_call(server, key, **body):
    body = {"session_id": "s1", "tool_name": "shell", "arguments": {"cmd": "ls"}, **body}
    return call(server, "POST", API, body, key)


def test_every_endpoint_and_status(site, alice, django_user_model):
    user, key = alice
    bob = django_user_model.objects.create_user("bob")
    bob_key = agentkeys.create_key(bob, "bob-bot")[1]
    status, obj = gate_call(site, key, description="list files")
    assert status == 201 and obj["status"] == "pending" and obj["decision"] is None
    aid = obj["approval_id"]
    row = Approval.objects.get(approval_id=aid)
    assert row.user == user and row.agent_key.name == "alice-bot" and row.waiter == ""
    assert row.agent_seen_at is not None
    assert (
        call(site, "POST", API, {"session_id": "s"}, None)[1]["error"] == "authentication_required"
    )
    assert call(site, "POST", API, {"session_id": "s"}, "tg_x")[1]["error"] == "invalid_key"
    assert gate_call(site, key, session_id="")[0] == 400
    assert gate_call(site, key, arguments={"a": "\ud800"})[1]["error"] == "invalid_field"
    assert gate_call(site, key, tool_name="a\x00")[0] == 400
    assert call(site, "GET", f"{API}/{aid}?wait=x", None, key)[0] == 400
    assert call(site, "GET", f"{API}/{aid}?wait=61", None, key)[0] == 400
    assert call(site, "GET", f"{API}/{aid}", None, bob_key) == (
        404,
        {"error": "not_found", "detail": "No tool call with that approval_id is yours."},
    )
    assert call(site, "GET", f"{API}/nope", None, key)[0] == 404
    status, obj = call(site, "GET", f"{API}/{aid}?wait=0.3", None, key)
    assert status == 200 and obj["status"] == "pending"
    # retries and taken ids
    assert gate_call(site, key, approval_id=aid)[0] == 200
    assert (
        gate_call(site, key, approval_id=aid, session_id="s2")[1]["error"] == "approval_id_in_use"
    )
    assert gate_call(site, bob_key, approval_id=aid)[0] == 409
    assert call(site, "POST", f"{API}/{aid}/executed", {}, key)[1]["error"] == "not_allowed"
    assert call(site, "POST", f"{API}/{aid}/cancel", None, bob_key)[0] == 404
    status, obj = call(site, "POST", f"{API}/{aid}/cancel", None, key)
    assert (status, obj["status"], obj["decided_via"]) == (200, "cancelled", "cancel")
    assert obj["message"] == gate.CANCELLED_MESSAGE
    status, obj = call(site, "POST", f"{API}/{aid}/cancel", None, key)
    assert (status, obj["error"], obj["status"]) == (409, "already_decided", "cancelled")
    assert Approval.objects.filter(approval_id=aid).count() == 1


def test_allowed_then_executed_once(site, alice):
    _, key = alice
    aid = gate_call(site, key)[1]["approval_id"]
    gate.resolve_tool_decision(aid, "allow")
    status, obj = call(
        site, "POST", f"{API}/{aid}/executed", {"ok": True, "summary": "2 files"}, key
    )
    assert status == 200 and obj["decision"] == "allow" and obj["executed_at"]
    assert obj["message"] is None
    row = Approval.objects.get(approval_id=aid)
    assert (row.execution_ok, row.execution_summary) == (True, "2 files")
    assert call(site, "POST", f"{API}/{aid}/executed", {}, key)[1]["error"] == "already_executed"


def test_rules_answer_at_once(site, alice):
    user, key = alice
    Rule.objects.create(user=user, tool_name="rm*", decision="deny")
    status, obj = gate_call(site, key, tool_name="rm_rf")
    assert status == 201 and obj["status"] == "denied" and obj["decided_via"] == "rule"
    assert obj["decision"] == "deny" and obj["message"].startswith(gate.TOOL_REJECTED_MESSAGE)


def test_a_revoked_key_stops_at_once(site, alice):
    _, key = alice
    assert gate_call(site, key)[0] == 201
    agentkeys.revoke_key("alice-bot")
    assert gate_call(site, key)[1]["error"] == "invalid_key"
    assert AgentKey.objects.get(name="alice-bot").last_used_at is not None


def _wait_in_thread(server, key, aid, seconds=30):
    result = {}

    def run():
        try:
            result["answer"] = call(server, "GET", f"{API}/{aid}?wait={seconds}", None, key)
        except OSError as exc:  # the server went away mid-wait
            result["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def test_a_decision_on_the_same_daphne_wakes_the_wait_at_once(site, alice, client):
    user, key = alice
    aid = gate_call(site, key)[1]["approval_id"]
    thread, result = _wait_in_thread(site, key, aid)
    time.sleep(0.5)  # the wait is open
    client.force_login(user)
    person = HttpClient(site, client.cookies["sessionid"].value)
    clicked = time.monotonic()
    status, body = person.post_json(
        "/api/inference/tool-confirm", {"approval_id": aid, "decision": "deny", "reason": "no"}
    )
    assert status == 200, body
    thread.join(10)
    woke = time.monotonic() - clicked
    status, obj = result["answer"]
    assert (status, obj["status"], obj["decision"]) == (200, "denied", "deny")
    assert obj["message"] == f"{gate.TOOL_REJECTED_MESSAGE} Reason: no"
    assert woke < 0.5, woke


def test_a_decision_elsewhere_wakes_the_wait_within_the_recheck(site, alice):
    _, key = alice
    aid = gate_call(site, key)[1]["approval_id"]
    thread, result = _wait_in_thread(site, key, aid)
    time.sleep(0.5)
    decided = time.monotonic()
    assert gate.resolve_tool_decision(aid, "allow", via="admin")
    thread.join(10)
    assert result["answer"][1]["status"] == "allowed"
    assert time.monotonic() - decided < FAST["RECHECK_INTERVAL"] + 1.0


def test_a_wait_that_runs_out_answers_pending(site, alice):
    _, key = alice
    aid = gate_call(site, key)[1]["approval_id"]
    started = time.monotonic()
    status, obj = call(site, "GET", f"{API}/{aid}?wait=1", None, key)
    assert (status, obj["status"]) == (200, "pending")
    assert 0.9 < time.monotonic() - started < 3


def test_a_wait_across_a_daphne_restart(child_env, alice):
    _, key = alice
    server = wait_ready(start_daphne(child_env, approvals=FAST))
    port = server.port
    aid = secrets.token_urlsafe(16)
    try:
        assert gate_call(server, key, approval_id=aid)[0] == 201
        thread, result = _wait_in_thread(server, key, aid)
        time.sleep(0.5)
        stop_process(server.proc)  # the open wait's connection drops
        thread.join(10)
        assert "error" in result  # the client saw a network error
    except BaseException:
        server.stop()
        raise
    server = wait_ready(start_daphne(child_env, port=port, approvals=FAST))
    try:
        assert gate_call(server, key, approval_id=aid)[0] == 200  # the client's retry
        thread, result = _wait_in_thread(server, key, aid)
        time.sleep(0.5)
        gate.resolve_tool_decision(aid, "allow")
        thread.join(10)
        assert result["answer"][1]["status"] == "allowed"
        assert Approval.objects.filter(approval_id=aid).count() == 1
    finally:
        server.stop()


def test_an_agent_that_goes_away_is_abandoned_but_an_open_wait_is_not(site, alice):
    _, key = alice
    gone = gate_call(site, key)[1]["approval_id"]
    waiting = gate_call(site, key)[1]["approval_id"]
    status, obj = call(site, "GET", f"{API}/{waiting}?wait=5", None, key)
    assert obj["status"] == "pending"  # held 5 s > AGENT_LEASE_TIMEOUT, never judged
    deadline = time.monotonic() + 10
    while Approval.objects.get(approval_id=gone).status == "pending":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    row = Approval.objects.get(approval_id=gone)
    assert (row.status, row.decided_via) == ("abandoned", "sweep")
