"""toolgate_site.onehop: a synchronous view's request in one thread hand-off, same answers."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import markcoroutinefunction
from django.core.handlers.asgi import ASGIHandler
from django.test import override_settings

from toolgate_site.onehop import OneHopASGIHandler
from toolgate_site.threads import PooledThreads

pytestmark = pytest.mark.django_db(transaction=True)


class AsyncOnly:
    """Middleware that can only run async and may answer any path."""

    sync_capable = False
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        markcoroutinefunction(self)

    async def __call__(self, request):
        return await self.get_response(request)


def _serve(app, method: str, path: str, body: bytes = b"", headers=()):
    """One request through the ASGI ``app``: (status, headers dict, body)."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"testserver"), *headers],
        "client": ("127.0.0.1", 40000),
        "server": ("testserver", 80),
    }
    sent: list[dict] = []
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive():
        if messages:
            return messages.pop(0)
        await asyncio.sleep(3600)

    async def send(message):
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    content = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], {k.decode().lower(): v.decode() for k, v in start["headers"]}, content


def _hand_offs(app, *request) -> int:
    """How many pieces of synchronous work one request hands to a request thread."""
    pool = PooledThreads(app, 1)
    lane = pool.lanes[0]
    count = 0
    submit = lane.submit

    def counting(fn, /, *args, **kwargs):
        nonlocal count
        count += 1
        return submit(fn, *args, **kwargs)

    lane.submit = counting
    try:
        _serve(pool, *request)
    finally:
        lane.shutdown()
    return count


def test_a_synchronous_view_is_served_in_one_hand_off_not_one_per_middleware():
    one_hop = _hand_offs(OneHopASGIHandler(), "GET", "/accounts/login/")
    django = _hand_offs(ASGIHandler(), "GET", "/accounts/login/")
    # request_started's receivers, the middleware chain with the view, and the
    # response's close (request_finished): three, where Django's chain hands
    # each middleware's process_request/process_response over on its own.
    assert one_hop == 3
    assert django >= 10


@pytest.mark.parametrize(
    "request_args",
    [
        ("GET", "/accounts/login/"),  # a page: session, CSRF cookie, security headers
        ("POST", "/api/inference/tool-confirm", b"{}", [(b"content-type", b"application/json")]),
        ("GET", "/api/inference/tool-approvals"),  # signed out: the JSON 401
        ("GET", "/no/such/page/"),  # no view: Django's async chain
        ("GET", "/api/inference/approvals/x"),  # an async view: Django's async chain
    ],
)
def test_answers_match_djangos_own_handler(request_args):
    ours = _serve(OneHopASGIHandler(), *request_args)
    theirs = _serve(ASGIHandler(), *request_args)
    assert ours[0] == theirs[0]
    assert set(ours[1]) == set(theirs[1])  # every header: security, CSRF cookie, vary...
    if request_args[0] == "POST":
        assert ours[0] == 403 or ours[0] == 401  # signed out, no CSRF token: refused


def test_which_paths_take_one_hop():
    handler = OneHopASGIHandler()
    assert handler.one_hop("/api/inference/tool-confirm")
    assert handler.one_hop("/approvals/")
    assert not handler.one_hop("/api/inference/approvals/abc")  # async view
    assert not handler.one_hop("/static/approvals/inbox.js")  # ServeStatic's
    assert not handler.one_hop("/no/such/page/")


def test_static_files_are_still_served(settings):
    settings.DEBUG = True  # ServeStatic finds files in the apps' folders
    with override_settings(SERVESTATIC_AUTOREFRESH=True, SERVESTATIC_USE_FINDERS=True):
        status, headers, body = _serve(OneHopASGIHandler(), "GET", "/static/approvals/inbox.js")
    assert status == 200
    assert headers["x-content-type-options"] == "nosniff"  # SecurityMiddleware ran
    assert body


def test_async_only_middleware_answering_any_path_keeps_djangos_chain(settings):
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, f"{__name__}.AsyncOnly"]
    handler = OneHopASGIHandler()
    assert handler.sync_handler is None
    assert not handler.one_hop("/api/inference/tool-confirm")
    assert _serve(handler, "GET", "/accounts/login/")[0] == 200


def test_servestatic_serving_other_paths_keeps_djangos_chain(settings):
    settings.SERVESTATIC_INDEX_FILE = True
    assert OneHopASGIHandler().sync_handler is None


def test_process_view_still_refuses_a_post_without_csrf_token():
    # CsrfViewMiddleware refuses in process_view, in the sync chain as in Django's.
    status, headers, body = _serve(
        OneHopASGIHandler(),
        "POST",
        "/accounts/login/",
        b"username=a&password=b",
        [(b"content-type", b"application/x-www-form-urlencoded")],
    )
    assert status == 403
    assert b"CSRF" in body
