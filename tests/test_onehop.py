"""toolgate_site.onehop: a synchronous view's request in one thread hand-off, same answers."""

from __future__ import annotations

import asyncio
from contextlib import contextmanager

import pytest
from asgiref.sync import markcoroutinefunction
from django.core.handlers.asgi import ASGIHandler
from django.core.signals import request_finished, request_started
from django.http import HttpResponse, StreamingHttpResponse
from django.test import override_settings
from django.urls import path

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


def _serve(app, method: str, path: str, body: bytes = b"", headers=(), send=None):
    """One request through the ASGI ``app``: (status, headers dict, body).

    ``send``: an ASGI send of the caller's instead (then the answer is ``None``)."""
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

    async def record(message):
        sent.append(message)

    if send is not None:
        asyncio.run(app(scope, receive, send))
        return None
    asyncio.run(app(scope, receive, record))
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
    # response's close (request_finished) in one, where Django's chain hands
    # each of them and each middleware's process_request/process_response over
    # on its own.
    assert one_hop == 1
    assert django >= 10


def _streamed(request):
    return StreamingHttpResponse(iter([b"one,", b"two"]), content_type="text/csv")


def _plain(request):
    return HttpResponse(b"plain")


urlpatterns = [path("streamed", _streamed), path("plain", _plain)]


@contextmanager
def _signals_seen():
    """(name, sender) of every request_started / request_finished sent meanwhile."""
    seen: list[tuple[str, type]] = []

    def started(sender, **kwargs):
        seen.append(("started", sender))

    def finished(sender, **kwargs):
        seen.append(("finished", sender))

    request_started.connect(started)
    request_finished.connect(finished)
    try:
        yield seen
    finally:
        request_started.disconnect(started)
        request_finished.disconnect(finished)


# The CSV export streams a synchronous iterator too; Django warns of it under ASGI.
SYNC_STREAM = "ignore:StreamingHttpResponse must consume synchronous iterators"


@override_settings(ROOT_URLCONF=__name__)
@pytest.mark.filterwarnings(SYNC_STREAM)
@pytest.mark.parametrize("path_", ["/plain", "/streamed"])
def test_request_signals_and_streamed_bodies_as_with_djangos_handler(path_):
    with _signals_seen() as ours:
        answer = _serve(OneHopASGIHandler(), "GET", path_)
    with _signals_seen() as theirs:
        expected = _serve(ASGIHandler(), "GET", path_)
    assert answer[0] == expected[0] == 200
    assert answer[2] == expected[2] == (b"plain" if path_ == "/plain" else b"one,two")
    # Each once, started first, sent by the handler's class, as Django does.
    assert [name for name, _ in ours] == [name for name, _ in theirs] == ["started", "finished"]
    assert {sender for _, sender in ours} == {OneHopASGIHandler}


@pytest.mark.filterwarnings(SYNC_STREAM)
def test_streamed_response_is_closed_after_its_body_is_sent():
    order: list[str] = []
    handler = OneHopASGIHandler()

    def finished(sender, **kwargs):
        order.append("finished")

    request_finished.connect(finished)
    try:
        with override_settings(ROOT_URLCONF=__name__):
            _serve(handler, "GET", "/streamed", send=_recording_send(order))
    finally:
        request_finished.disconnect(finished)
    assert order[-1] == "finished"
    assert order.count("body") >= 1 and order.index("finished") > order.index("body")


def _recording_send(order: list[str]):
    async def send(message):
        order.append("body" if message["type"] == "http.response.body" else "start")

    return send


def test_an_answer_the_client_no_longer_waits_for_is_dropped():
    # ASGI servers may raise OSError when sending on a closed connection.
    async def gone(message):
        raise ConnectionResetError("client went away")

    with _signals_seen() as seen, override_settings(ROOT_URLCONF=__name__):
        _serve(OneHopASGIHandler(), "GET", "/plain", send=gone)
    assert [name for name, _ in seen] == ["started", "finished"]


def test_one_hop_answers_follow_the_urlconf():
    handler = OneHopASGIHandler()
    assert handler.one_hop("/api/inference/tool-confirm")
    assert not handler.one_hop("/plain")
    with override_settings(ROOT_URLCONF=__name__):
        assert handler.one_hop("/plain")
        assert not handler.one_hop("/api/inference/tool-confirm")


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
