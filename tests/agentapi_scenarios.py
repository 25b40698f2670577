"""Requests that produce every documented answer of the agent API (for the OpenAPI test)."""

from __future__ import annotations

import json
from unittest import mock

from django.db import OperationalError
from django.test import Client

from approvals import agentkeys, gate

PREFIX = "/api/inference"


def agent_scenarios(user_model):
    alice = user_model.objects.create_user("agent-alice")
    bob = user_model.objects.create_user("agent-bob")
    _, key = agentkeys.create_key(alice, "alice-bot")
    _, bob_key = agentkeys.create_key(bob, "bob-bot")
    revoked, revoked_key = agentkeys.create_key(alice, "old-bot")
    agentkeys.revoke_key(revoked.name)
    me = Client(HTTP_AUTHORIZATION=f"Bearer {key}")
    other = Client(HTTP_AUTHORIZATION=f"Bearer {bob_key}")
    anonymous = Client()
    stale = Client(HTTP_AUTHORIZATION=f"Bearer {revoked_key}")

    def post(client, path, body=None):
        data = "" if body is None else body if isinstance(body, str) else json.dumps(body)
        return client.post(PREFIX + path, data, content_type="application/json")

    def gated(client=me, **body):
        body = {"session_id": "s1", "tool_name": "shell", "arguments": {"cmd": "ls"}, **body}
        return post(client, "/approvals", body).json()["approval_id"]

    def retry():
        aid = gate.new_approval_id()
        gated(approval_id=aid)
        return post(me, "/approvals", {"session_id": "s1", "tool_name": "t", "approval_id": aid})

    def taken():
        aid = gated()
        return post(other, "/approvals", {"session_id": "s1", "tool_name": "t", "approval_id": aid})

    def down(make):
        def run():
            with mock.patch(
                "approvals.agentkeys.AgentKey.objects.select_related",
                side_effect=OperationalError("database is locked"),
            ):
                return make()

        return run

    def allowed():
        aid = gated()
        gate.resolve_tool_decision(aid, "allow")
        return aid

    def executed_twice():
        aid = allowed()
        post(me, f"/approvals/{aid}/executed", {"ok": True})
        return post(me, f"/approvals/{aid}/executed", {"ok": True})

    def cancelled_twice():
        aid = gated()
        post(me, f"/approvals/{aid}/cancel")
        return post(me, f"/approvals/{aid}/cancel")

    a, g, c, e = (
        "/approvals",
        "/approvals/{approval_id}",
        "/approvals/{approval_id}/cancel",
        "/approvals/{approval_id}/executed",
    )
    body = {"session_id": "s1", "tool_name": "shell"}
    return [
        (a, "post", 201, lambda: post(me, "/approvals", body)),
        (a, "post", 200, retry),
        (a, "post", 400, lambda: post(me, "/approvals", {"session_id": "s1"})),
        (a, "post", 401, lambda: post(anonymous, "/approvals", body)),
        (a, "post", 401, lambda: post(stale, "/approvals", body)),
        (a, "post", 405, lambda: me.get(PREFIX + "/approvals")),
        (a, "post", 409, taken),
        (a, "post", 503, down(lambda: post(me, "/approvals", body))),
        (g, "get", 200, lambda: me.get(f"{PREFIX}/approvals/{gated()}?wait=0.1")),
        (g, "get", 400, lambda: me.get(f"{PREFIX}/approvals/{gated()}?wait=61")),
        (g, "get", 401, lambda: anonymous.get(f"{PREFIX}/approvals/x")),
        (g, "get", 404, lambda: me.get(f"{PREFIX}/approvals/{gated(other)}")),
        (g, "get", 405, lambda: post(me, f"/approvals/{gated()}")),
        (g, "get", 503, down(lambda: me.get(f"{PREFIX}/approvals/x"))),
        (c, "post", 200, lambda: post(me, f"/approvals/{gated()}/cancel")),
        (c, "post", 400, lambda: post(me, f"/approvals/{gated()}/cancel", "x" * 20000)),
        (c, "post", 401, lambda: post(anonymous, "/approvals/x/cancel")),
        (c, "post", 404, lambda: post(me, "/approvals/unknown/cancel")),
        (c, "post", 405, lambda: me.get(f"{PREFIX}/approvals/x/cancel")),
        (c, "post", 409, cancelled_twice),
        (c, "post", 503, down(lambda: post(me, "/approvals/x/cancel"))),
        (e, "post", 200, lambda: post(me, f"/approvals/{allowed()}/executed", {"summary": "ok"})),
        (e, "post", 400, lambda: post(me, f"/approvals/{allowed()}/executed", {"ok": "yes"})),
        (e, "post", 401, lambda: post(anonymous, "/approvals/x/executed")),
        (e, "post", 404, lambda: post(other, f"/approvals/{allowed()}/executed")),
        (e, "post", 405, lambda: me.get(f"{PREFIX}/approvals/x/executed")),
        (e, "post", 409, executed_twice),
        (e, "post", 503, down(lambda: post(me, "/approvals/x/executed"))),
    ]  # fmt: skip
