"""AgentWaitApp: waiting GETs served beside Django's request cycle, the rest passed on."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from asgiref.sync import sync_to_async

from approvals import agentkeys, gate
from approvals.agentapi.asgi import AgentWaitApp

pytestmark = pytest.mark.django_db(transaction=True)
API = "/api/inference/approvals"


class Inner:
    """Stands for Django's HTTP app: records what reached it."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    async def __call__(self, scope, receive, send) -> None:
        self.paths.append(scope["path"])
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})


def scope(path: str, query: str, key: str, method: str = "GET") -> dict:
    return {
        "type": "http",
        "method": method,
        "path": path,
        "root_path": "",
        "query_string": query.encode(),
        "headers": [(b"authorization", f"Bearer {key}".encode()), (b"host", b"127.0.0.1")],
        "server": ("127.0.0.1", 80),
        "client": ("127.0.0.1", 5000),
        "scheme": "http",
    }


async def request(app, sc, disconnect: asyncio.Event | None = None):
    sent: list[dict] = []
    first = True

    async def receive():
        nonlocal first
        if first:
            first = False
            return {"type": "http.request", "body": b"", "more_body": False}
        await (disconnect or asyncio.Event()).wait()
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    await app(sc, receive, send)
    if not sent:
        return None, None, None
    headers = dict(sent[0]["headers"])
    return sent[0]["status"], headers, json.loads(sent[1]["body"] or b"null")


@pytest.fixture
def key(django_user_model):
    user = django_user_model.objects.create_user("alice")
    return user, agentkeys.create_key(user, "bot")[1]


def _gated(user) -> str:
    aid = gate.new_approval_id()
    slot = gate.begin_tool_decision("s1", aid, tool_name="shell", user=user)
    from approvals.listener import get_listener

    get_listener().unregister(slot)
    return aid


def test_many_waits_hold_no_thread_and_wake_on_the_decision(key):
    user, raw = key
    ids = [_gated(user) for _ in range(30)]
    inner = Inner()
    app = AgentWaitApp(inner)

    async def scenario():
        tasks = [
            asyncio.ensure_future(request(app, scope(f"{API}/{aid}", "wait=30", raw)))
            for aid in ids
        ]
        await asyncio.sleep(1.0)
        threads = threading.active_count()
        for aid in ids:
            await sync_to_async(gate.resolve_tool_decision)(aid, "allow")
        answers = await asyncio.wait_for(asyncio.gather(*tasks), 20)
        return threads, answers

    before = threading.active_count()
    threads, answers = asyncio.run(scenario())
    assert threads - before < 10  # the loop's small executor, not one per waiting request
    assert {status for status, _, _ in answers} == {200}
    assert {body["status"] for _, _, body in answers} == {"allowed"}
    headers = answers[0][1]
    assert headers[b"content-type"] == b"application/json"
    assert headers[b"x-content-type-options"] == b"nosniff"
    assert inner.paths == []


def test_errors_are_the_views_own(key):
    user, raw = key
    aid = _gated(user)
    app = AgentWaitApp(Inner())
    status, _, body = asyncio.run(request(app, scope(f"{API}/{aid}", "wait=30", "tg_bad")))
    assert (status, body["error"]) == (401, "invalid_key")
    status, _, body = asyncio.run(request(app, scope(f"{API}/{aid}", "wait=99", raw)))
    assert (status, body["error"]) == (400, "invalid_field")


def test_other_requests_pass_through(key):
    user, raw = key
    aid = _gated(user)
    inner = Inner()
    app = AgentWaitApp(inner)
    for sc in (
        scope(f"{API}/{aid}", "", raw),  # no wait: Django's
        scope(f"{API}/{aid}/cancel", "wait=1", raw, "POST"),
        scope("/admin/", "wait=1", raw),
        scope("/nowhere/", "wait=1", raw),
    ):
        asyncio.run(request(app, sc))
    assert len(inner.paths) == 4


def test_a_disconnect_ends_the_wait(key):
    user, raw = key
    aid = _gated(user)
    app = AgentWaitApp(Inner())

    async def scenario():
        gone = asyncio.Event()
        task = asyncio.ensure_future(request(app, scope(f"{API}/{aid}", "wait=30", raw), gone))
        await asyncio.sleep(0.5)
        gone.set()
        return await asyncio.wait_for(task, 5)

    assert asyncio.run(scenario()) == (None, None, None)
    from approvals.agentapi import waits

    assert waits.waiting_here() == 0


def test_a_host_outside_allowed_hosts_goes_to_django(key, settings):
    """A waiting GET naming a host ALLOWED_HOSTS refuses is Django's to answer (its 400)."""
    user, raw = key
    aid = _gated(user)
    settings.ALLOWED_HOSTS = ["approvals.example.com"]
    inner = Inner()
    app = AgentWaitApp(inner)
    asyncio.run(request(app, scope(f"{API}/{aid}", "wait=1", raw)))  # Host: 127.0.0.1
    assert inner.paths == [f"{API}/{aid}"]
    allowed = scope(f"{API}/{aid}", "wait=1", raw)
    allowed["headers"] = [
        (k, b"approvals.example.com" if k == b"host" else v) for k, v in allowed["headers"]
    ]
    status, _, body = asyncio.run(request(app, allowed))
    assert (status, body["status"]) == (200, "pending")  # answered here after the 1 s wait
    assert inner.paths == [f"{API}/{aid}"]
