"""Hostile input: property-based tests over the HTTP body and WebSocket frames, and
schemathesis against the shipped OpenAPI document.

Properties, for any request body or frame: never a 5xx, never a crash or a
closed socket, always a JSON answer with a stable error code when refused, and
never a state change unless the answer says the request decided the call. The
hostile parts: wrong types, huge strings, deep nesting, unicode (lone
surrogates, NULs, right-to-left marks), duplicate keys, missing and extra
fields, bytes that are not UTF-8.

Budget: ``TOOLGATE_FUZZ_EXAMPLES`` examples per property (default 500: about
2,000 cases in all, under a minute); ``make fuzz`` raises it.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from urllib.parse import quote

import pytest
from channels.testing import WebsocketCommunicator
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from approvals import gate
from approvals.listener import get_listener
from approvals.models import Approval, Status
from toolgate_site.asgi import application

pytestmark = pytest.mark.django_db(transaction=True)

EXAMPLES = int(os.environ.get("TOOLGATE_FUZZ_EXAMPLES", "500"))
CONFIRM = "/api/inference/tool-confirm"
ERROR_CODES = {
    "invalid_json",
    "missing_field",
    "invalid_field",
    "invalid_decision",
    "too_large",
    "not_found",
    "already_decided",
    "unknown_type",
}
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)

# -- strategies ----------------------------------------------------------------

hostile_text = st.one_of(
    st.text(max_size=40),
    st.text(st.characters(codec=None, categories=None), max_size=40),  # surrogates too
    st.sampled_from(["allow", "deny", "ALLOW", "allow\x00", " allow", "allow ", "\u202eallow"]),
    st.sampled_from(["", "\x00", "\ud800", "𝕒𝕝𝕝𝕠𝕨", "a" * 129, "s" * 256, "r" * 2001]),
    st.integers(1, 40_000).map(lambda n: "x" * n),
)
json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    hostile_text,
)
json_value = st.recursive(
    json_leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
FIELDS = ("approval_id", "decision", "session_id", "reason", "remember", "type")


def decision_bodies(aid: str):
    """Dicts shaped like a decision request, each field absent, hostile or plausible."""
    plausible = {
        "approval_id": st.sampled_from([aid, aid.upper(), aid + " ", aid[:-1], "x" * 22]),
        "decision": st.sampled_from(["allow", "deny"]),
        "session_id": st.sampled_from(["s-fuzz", "other", ""]),
        "reason": st.text(max_size=30),
        "remember": st.sampled_from(["session", "always", "never"]),
        "type": st.just("tool_confirm"),
    }
    field = {
        name: st.one_of(st.just(_ABSENT), json_value, hostile_text, strategy)
        for name, strategy in plausible.items()
    }
    extra = st.dictionaries(st.text(max_size=10), json_value, max_size=3)
    return st.builds(_assemble, st.fixed_dictionaries(field), extra)


_ABSENT = object()


def _assemble(fields: dict, extra: dict) -> dict:
    body = {k: v for k, v in extra.items() if k not in FIELDS}
    body.update({k: v for k, v in fields.items() if v is not _ABSENT})
    return body


def raw_payloads(aid: str):
    """Bodies that are not one well-formed JSON object."""
    dup = json.dumps({"approval_id": aid, "decision": "allow"})
    return st.one_of(
        st.binary(max_size=200),
        st.text(max_size=200).map(str.encode),
        st.integers(1, 3000).map(lambda n: ("[" * n + "]" * n).encode()),
        st.integers(1, 3000).map(lambda n: ('{"a":' * n + "1" + "}" * n).encode()),
        st.integers(16_000, 70_000).map(lambda n: json.dumps({"reason": "r" * n}).encode()),
        st.sampled_from(
            [
                dup[:-1] + f', "approval_id": "{aid}"}}',
                dup[:-1] + ', "decision": "deny"}',
                dup.replace("allow", "\\u0061llow") + " trailing",
                dup + dup,
                dup.replace('"', "'"),
                dup.encode("utf-16").decode("latin-1"),
                "\ufeff" + dup,
                dup[:-1],
                "null",
                "NaN",
                '"allow"',
            ]
        ).map(lambda s: s.encode("utf-8", "surrogatepass")),
        json_value.map(lambda v: json.dumps(v).encode()),
    )


# -- the state oracle ------------------------------------------------------------


class Target:
    """One pending call of the signed-in user; renewed whenever a request decides it."""

    def __init__(self, user) -> None:
        self.user = user
        self.renew()

    def renew(self) -> None:
        self.aid = gate.new_approval_id()
        slot = gate.begin_tool_decision("s-fuzz", self.aid, user=self.user, tool_name="shell")
        get_listener().unregister(slot)

    def check(self, decided: bool, sent: object) -> None:
        row = Approval.objects.values("status", "decided_via").get(approval_id=self.aid)
        if not decided:
            assert row["status"] == Status.PENDING, (sent, row)
            return
        assert isinstance(sent, dict) and sent.get("decision") in ("allow", "deny"), sent
        assert row["status"] == ("allowed" if sent["decision"] == "allow" else "denied")
        self.renew()


def _total_rows_decided() -> int:
    return Approval.objects.exclude(status=Status.PENDING).count()


@pytest.fixture
def person(django_user_model):
    user = django_user_model.objects.create_user("fuzzer")
    client = Client()
    client.force_login(user)
    return user, client


# -- HTTP --------------------------------------------------------------------------


def _post(client: Client, raw: bytes, content_type: str = "application/json") -> tuple[int, dict]:
    response = client.post(CONFIRM, raw, content_type=content_type)
    assert response.status_code < 500, response.content[:300]
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert body["resolved"] is (response.status_code == 200)
    if response.status_code != 200:
        assert body["error"] in ERROR_CODES and body["detail"], body
        assert response.status_code in (400, 404, 409)
    return response.status_code, body


def test_http_decision_bodies(person):
    user, client = person
    target = Target(user)

    @FUZZ
    @given(data=st.data())
    def run(data):
        body = data.draw(decision_bodies(target.aid))
        before = _total_rows_decided()
        status, answer = _post(client, json.dumps(body).encode("utf-8", "surrogatepass"))
        target.check(status == 200, body)
        assert _total_rows_decided() == before + (status == 200)

    run()


def test_http_raw_bodies(person):
    user, client = person
    target = Target(user)

    @settings(FUZZ, max_examples=max(1, EXAMPLES * 2 // 3))
    @given(data=st.data(), content_type=st.sampled_from(["application/json", "text/plain", ""]))
    def run(data, content_type):
        raw = data.draw(raw_payloads(target.aid))
        before = _total_rows_decided()
        status, _ = _post(client, raw, content_type)
        # A raw payload decides only if it is one valid JSON object after all.
        target.check(status == 200, _loads_or_none(raw))
        assert _total_rows_decided() == before + (status == 200)

    run()


def _loads_or_none(raw: bytes):
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return None


def _percent(text: str) -> str:
    """``text`` as a query value: UTF-8, lone surrogates kept as their (invalid) bytes."""
    return quote(text.encode("utf-8", "surrogatepass"), safe="")


query_values = st.one_of(
    hostile_text.map(_percent),
    st.binary(max_size=20).map(lambda raw: quote(raw, safe="")),
    st.sampled_from(["%00", "%ED%A0%80", "a%00b", "%C0%80", "%FF", "%", "%zz"]),
)


def test_query_strings(person):
    """``?session_id=`` on the list and the page: never a 5xx, whatever the bytes."""
    _, client = person

    @settings(FUZZ, max_examples=max(1, EXAMPLES // 3))
    @given(
        value=query_values, where=st.sampled_from(["/api/inference/tool-approvals", "/approvals/"])
    )
    def run(value, where):
        response = client.get(f"{where}?session_id={value}")
        assert response.status_code in (200, 400), (value, response.content[:300])
        if where.startswith("/api/") and response.status_code == 400:
            assert response.json()["error"] == "invalid_field"

    run()


# -- WebSocket ---------------------------------------------------------------------


class LiveSocket:
    """A signed-in socket on an event loop in its own thread, driven synchronously."""

    def __init__(self, sessionid: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.comm = self.call(self._open(sessionid))

    def call(self, coro, timeout: float = 15.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _open(self, sessionid: str) -> WebsocketCommunicator:
        comm = WebsocketCommunicator(
            application,
            "/ws/approvals/",
            headers=[
                (b"origin", b"http://localhost"),
                (b"cookie", f"sessionid={sessionid}".encode()),
            ],
        )
        connected, _ = await comm.connect(timeout=10)
        assert connected
        assert (await comm.receive_json_from(timeout=10))["type"] == "snapshot"
        return comm

    async def _exchange(self, text: str | None, data: bytes | None) -> dict:
        # send_input, not send_to: an empty frame is legal on the wire.
        if data is not None:
            await self.comm.send_input({"type": "websocket.receive", "bytes": data})
        else:
            await self.comm.send_input({"type": "websocket.receive", "text": text})
        while True:
            message = await self.comm.receive_json_from(timeout=10)
            if message["type"] in ("error", "tool_confirm_result"):
                return message
            assert message["type"] in ("tool_start", "tool_decision"), message

    def exchange(self, text: str | None = None, data: bytes | None = None) -> dict:
        return self.call(self._exchange(text, data))

    def close(self) -> None:
        try:
            self.call(self.comm.disconnect())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(5)


@pytest.fixture
def live_socket(person):
    sock = LiveSocket(person[1].cookies["sessionid"].value)
    yield sock
    sock.close()


def _check_reply(reply: dict) -> bool:
    if reply["type"] == "error":
        assert reply["error"] in ERROR_CODES and reply["detail"], reply
        return False
    if not reply["resolved"]:
        assert reply["error"] in ERROR_CODES, reply
    return reply["resolved"]


def test_websocket_frames(person, live_socket):
    target = Target(person[0])

    @FUZZ
    @given(data=st.data())
    def run(data):
        body = data.draw(decision_bodies(target.aid))
        if data.draw(st.booleans()):
            body["type"] = "tool_confirm"
        before = _total_rows_decided()
        resolved = _check_reply(live_socket.exchange(json.dumps(body)))
        target.check(resolved, body)
        assert _total_rows_decided() == before + resolved

    run()


def test_websocket_raw_frames(person, live_socket):
    target = Target(person[0])

    @settings(FUZZ, max_examples=max(1, EXAMPLES * 2 // 3))
    @given(data=st.data(), as_bytes=st.booleans())
    def run(data, as_bytes):
        raw = data.draw(raw_payloads(target.aid))
        before = _total_rows_decided()
        if as_bytes:
            reply = live_socket.exchange(data=raw)
            assert reply["type"] == "error"
        else:
            reply = live_socket.exchange(text=raw.decode("utf-8", "replace"))
        resolved = _check_reply(reply)
        target.check(resolved, _loads_or_none(raw))
        assert _total_rows_decided() == before + resolved

    run()


# -- schemathesis against the shipped document ----------------------------------------


def _openapi_schema():
    import schemathesis
    from django.core.wsgi import get_wsgi_application

    return schemathesis.openapi.from_wsgi("/api/inference/openapi.json", get_wsgi_application())


schema = _openapi_schema()


@pytest.fixture
def signed_in_headers(person) -> dict:
    user, client = person
    Target(user)  # something pending to find
    csrf = "f" * 32
    cookie = f"sessionid={client.cookies['sessionid'].value}; csrftoken={csrf}"
    from approvals import agentkeys  # the agent API's endpoints take a bearer key

    key = agentkeys.create_key(user, "fuzz-bot")[1]
    return {"Cookie": cookie, "X-CSRFToken": csrf, "Authorization": f"Bearer {key}"}


@schema.parametrize()
@settings(
    max_examples=max(1, EXAMPLES // 5),
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_openapi_document_holds_for_generated_requests(case, signed_in_headers):
    from schemathesis.checks import (
        content_type_conformance,
        not_a_server_error,
        response_schema_conformance,
        status_code_conformance,
    )

    response = case.call(headers=signed_in_headers)
    checks = [not_a_server_error]
    if _routed(case):
        checks += [status_code_conformance, content_type_conformance, response_schema_conformance]
    # else: a path the URLconf never routes to the app (a non-integer rule id) gets
    # Django's own 404 page; only "never a 5xx" applies to it.
    case.validate_response(response, checks=checks)


def _routed(case) -> bool:
    from django.urls import Resolver404, resolve

    try:
        resolve("/api/inference" + case.formatted_path)
    except Resolver404:
        return False
    return True
