"""Every text input refuses a lone surrogate or a NUL with a 400 or an error reply.

JSON bodies (tool-confirm, rule revoke, the agent API), WebSocket frames and
query strings (``?session_id=`` on tool-approvals, the socket and the page;
``?wait=`` on the agent API; percent-encoded ``%00`` and ``%ED%A0%80`` too).
Never a 500, a 1011 or a 503: a NUL that reached PostgreSQL used to be
answered as a database outage. The same cases run on PostgreSQL when
``TOOLGATE_TEST_DATABASE_URL`` names one (``-m postgres``).
"""

from __future__ import annotations

import asyncio
import json

import pytest
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import Permission
from django.db import connection
from django.test import AsyncClient, Client

from approvals import agentkeys, gate
from approvals.listener import get_listener
from toolgate_site.asgi import application

from .conftest import requires_postgres

pytestmark = pytest.mark.django_db(transaction=True)

API = "/api/inference/"
BAD = {"nul": "a\x00b", "surrogate": "a\ud800b"}
#: The same two, percent-encoded in a URL (``%ED%A0%80`` is a surrogate in CESU/UTF-8 form).
BAD_QUERY = {"nul": "a%00b", "surrogate": "a%ED%A0%80b", "raw_surrogate_bytes": "%ED%A0%80"}
OK = (200, 201, 400, 401, 404, 409)


def _json(text: dict) -> bytes:
    return json.dumps(text).encode("utf-8", "surrogatepass")


@pytest.fixture
def alice(django_user_model):
    user = django_user_model.objects.create_user("alice")
    user.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    return user


@pytest.fixture
def pending(alice) -> str:
    aid = gate.new_approval_id()
    get_listener().unregister(gate.begin_tool_decision("s1", aid, user=alice, tool_name="shell"))
    return aid


@pytest.fixture
def agent_key(alice) -> str:
    return agentkeys.create_key(alice, "alice-bot")[1]


def _confirm_bodies(aid: str, bad: str) -> list[bytes]:
    base = {"approval_id": aid, "decision": "allow"}
    bodies = [{**base, name: bad} for name in ("approval_id", "decision", "session_id", "reason")]
    bodies += [{**base, "remember": bad}]
    raw = [_json(body) for body in bodies]
    raw.append(_json(base).replace(b'"allow"', b'"a\xed\xa0\x80"'))  # not UTF-8 at all
    return raw


def _agent_bodies(bad: str) -> list[bytes]:
    base = {"session_id": "s1", "tool_name": "shell", "arguments": {"cmd": "ls"}}
    bodies = [{**base, name: bad} for name in ("session_id", "tool_name", "tool_call_id")]
    bodies += [{**base, "approval_id": bad}, {**base, "description": bad}]
    bodies += [{**base, "arguments": {"cmd": bad}}, {**base, "arguments": {bad: 1}}]
    bodies += [{**base, "arguments_schema": {"title": bad}}]
    return [_json(body) for body in bodies]


def _http_cases(aid: str, key: str, bad: str, bad_query: str) -> list[tuple]:
    """``(method, path, body, headers)`` for every text input of the HTTP endpoints."""
    bearer = {"HTTP_AUTHORIZATION": f"Bearer {key}"}
    # A header is bytes on the wire: the surrogate's bytes, as a server decodes them.
    header = bad.encode("utf-8", "surrogatepass").decode("latin-1")
    cases: list[tuple] = [("POST", API + "tool-confirm", b, {}) for b in _confirm_bodies(aid, bad)]
    cases += [("POST", API + "approvals", b, bearer) for b in _agent_bodies(bad)]
    cases += [
        ("GET", f"{API}tool-approvals?session_id={bad_query}", None, {}),
        ("GET", f"/approvals/?session_id={bad_query}", None, {}),
        ("GET", f"{API}approvals/{aid}?wait={bad_query}", None, bearer),
        ("GET", f"{API}approvals/{bad_query}", None, bearer),
        ("POST", f"{API}approvals/{bad_query}/cancel", b"", bearer),
        ("POST", f"{API}approvals/{bad_query}/executed", b"", bearer),
        ("POST", f"{API}approvals/{aid}/executed", _json({"summary": bad}), bearer),
        ("POST", f"{API}rules/{bad_query}/revoke", _json({"note": bad}), {}),
        ("GET", f"{API}rules?x={bad_query}", None, {}),
        ("POST", f"{API}approvals", _json({"session_id": "s"}), {"HTTP_AUTHORIZATION": header}),
        (
            "GET",
            f"{API}approvals/{aid}",
            None,
            {"HTTP_AUTHORIZATION": f"Bearer tg_{(header + '0' * 8)[:8]}_x"},
        ),
    ]
    return cases


def _check(status: int, content: bytes, case: tuple) -> None:
    assert status in OK, (status, case, content[:300])
    if case[1].startswith(API):
        body = json.loads(content)
        if status == 400:
            assert body["error"] and body["detail"], case


@pytest.mark.parametrize("kind", sorted(BAD))
def test_http_refuses_bad_text_in_every_input(alice, pending, agent_key, kind):
    client = Client(enforce_csrf_checks=False)
    client.force_login(alice)
    for case in _http_cases(pending, agent_key, BAD[kind], BAD_QUERY[kind]):
        method, path, body, headers = case
        if method == "GET":
            response = client.get(path, **headers)
        else:
            response = client.post(path, body, content_type="application/json", **headers)
        _check(response.status_code, response.content, case)
    assert status_of(pending) == "pending"


@pytest.mark.parametrize("kind", sorted(BAD))
def test_http_under_asgi_refuses_bad_text_in_every_input(alice, pending, agent_key, kind):
    async def scenario():
        client = AsyncClient()
        await client.aforce_login(alice)
        for case in _http_cases(pending, agent_key, BAD[kind], BAD_QUERY[kind]):
            method, path, body, headers = case
            if method == "GET":
                response = await client.get(path, **headers)
            else:
                response = await client.post(path, body, content_type="application/json", **headers)
            _check(response.status_code, response.content, case)

    asyncio.run(asyncio.wait_for(scenario(), 60))
    assert status_of(pending) == "pending"


def test_raw_surrogate_bytes_in_a_query_string_are_not_a_500(alice):
    client = Client()
    client.force_login(alice)
    for query in BAD_QUERY.values():
        response = client.get(f"{API}tool-approvals?session_id={query}")
        assert response.status_code in (200, 400), (query, response.content[:200])


def status_of(aid: str) -> str:
    from approvals.models import Approval

    return Approval.objects.get(approval_id=aid).status


def _cookie(user) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


async def _socket(cookie: str, query: str = "") -> WebsocketCommunicator:
    headers = [(b"origin", b"http://localhost"), (b"cookie", f"sessionid={cookie}".encode())]
    comm = WebsocketCommunicator(application, "/ws/approvals/" + query, headers=headers)
    connected, _ = await comm.connect(timeout=5)
    assert connected
    return comm


@pytest.mark.parametrize("kind", sorted(BAD))
def test_websocket_frames_with_bad_text_get_an_error_reply(alice, pending, kind):
    bad = BAD[kind]
    cookie = _cookie(alice)
    base = {"type": "tool_confirm", "approval_id": pending, "decision": "allow"}
    frames = [{**base, name: bad} for name in ("approval_id", "decision", "reason", "remember")]
    frames += [{**base, "session_id": bad}, {**base, "type": bad}]

    async def scenario():
        comm = await _socket(cookie)
        assert (await comm.receive_json_from(timeout=5))["type"] == "snapshot"
        replies = []
        for frame in frames:
            # json.dumps escapes the surrogate; the raw character goes as well.
            for text in (json.dumps(frame), json.dumps(frame, ensure_ascii=False)):
                await comm.send_to(text_data=text)
                replies.append(await comm.receive_json_from(timeout=5))
        await comm.send_to(text_data=bad)
        replies.append(await comm.receive_json_from(timeout=5))
        assert await comm.receive_nothing(0.2)  # still open: no close frame
        await comm.disconnect()
        return replies

    replies = asyncio.run(asyncio.wait_for(scenario(), 30))
    for reply in replies:
        assert reply.get("error") and reply.get("resolved") is not True, reply
    assert status_of(pending) == "pending"


@pytest.mark.parametrize("query", sorted(BAD_QUERY.values()))
def test_a_websocket_query_with_bad_text_is_refused_or_ignored(alice, query):
    cookie = _cookie(alice)

    async def scenario():
        comm = await _socket(cookie, f"?session_id={query}")
        first = await comm.receive_output(timeout=5)
        rest = []
        if first["type"] == "websocket.send":
            message = json.loads(first["text"])
            if message["type"] == "error":
                rest.append(await comm.receive_output(timeout=5))
        await comm.disconnect()
        return first, rest

    first, rest = asyncio.run(asyncio.wait_for(scenario(), 20))
    message = json.loads(first["text"])
    if message["type"] == "error":
        assert message["error"] == "invalid_field"
        assert rest[0] == {"type": "websocket.close", "code": 4400}
    else:
        assert message["type"] == "snapshot"


@pytest.mark.postgres
@requires_postgres()
@pytest.mark.skipif(connection.vendor != "postgresql", reason="needs PostgreSQL")
@pytest.mark.parametrize("kind", sorted(BAD))
def test_on_postgresql_bad_text_never_reaches_the_database(alice, pending, agent_key, kind):
    test_http_refuses_bad_text_in_every_input(alice, pending, agent_key, kind)
    test_websocket_frames_with_bad_text_get_an_error_reply(alice, pending, kind)
